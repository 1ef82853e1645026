"""The frontier of hourly power limits (`recap_frontier.frontier_kg`) on runs whose optimum is worked out by hand."""

import numpy as np
import pytest

from scheduling.evaluation.recap_frontier import FrontierRun, frontier_kg

# a limit 10 % slower that draws 0.8 kW instead of 1 kW: 0.88 kWh per hour of work instead of 1
OPTIONS = {"time_factors": (1.0, 1.1), "draws_kw": (1.0, 0.8)}


def test_no_run_time_budget_keeps_the_maximum_limit():
    run = FrontierRun(start_h=0.0, work_h=10.0, intensity=np.full(24, 100.0), **OPTIONS)
    assert frontier_kg([run], 0.0) == pytest.approx(10 * 1.0 * 100 / 1000)


def test_flat_intensity_spends_the_budget_at_the_slower_limit():
    # 10.5 h for 10 h of work: s hours slow with s/1.1 + (10.5 - s) = 10, so s = 5.5 (5 h of work at 0.88 kWh)
    run = FrontierRun(start_h=0.0, work_h=10.0, intensity=np.full(24, 100.0), **OPTIONS)
    assert frontier_kg([run], 0.05) == pytest.approx((5 * 1.0 + 5.5 * 0.8) * 100 / 1000)


def test_the_slower_limit_goes_to_the_dirty_hours():
    # hours 0-4 at 200 g/kWh, then 100: all 5 dirty hours slow (800 g), then 5 h fast and 0.5 h slow (540 g)
    ci = np.array([200.0] * 5 + [100.0] * 19)
    run = FrontierRun(start_h=0.0, work_h=10.0, intensity=ci, **OPTIONS)
    assert frontier_kg([run], 0.05) == pytest.approx((5 * 0.8 * 200 + 5 * 1.0 * 100 + 0.5 * 0.8 * 100) / 1000)


def test_a_partial_start_hour_and_a_budget_shared_between_runs():
    # starting at 0.5 h, hour 0 costs 300 g/kWh: the shared budget (5 % of 20 h = 1 h) first slows the run that
    # sits in the dirtier hours; both here are flat, so it goes to the dirtier run (1.1 h slow = 1 h of work)
    clean = FrontierRun(start_h=0.5, work_h=10.0, intensity=np.full(24, 100.0), **OPTIONS)
    dirty = FrontierRun(start_h=0.5, work_h=10.0, intensity=np.full(24, 300.0), **OPTIONS)
    got = frontier_kg([clean, dirty], 0.05)
    # dirty: 11 h slow (10 h of work), time +1 h: 11 * 0.8 * 300; clean: 10 h at 1 kW * 100
    assert got == pytest.approx((11 * 0.8 * 300 + 10 * 1.0 * 100) / 1000)


def test_a_budget_per_run_slows_each_run_by_its_own_share():
    # 0.5 h each: both runs spend it as in the flat case (5.5 h slow), the dirty one at three times the intensity
    clean = FrontierRun(start_h=0.5, work_h=10.0, intensity=np.full(24, 100.0), **OPTIONS)
    dirty = FrontierRun(start_h=0.5, work_h=10.0, intensity=np.full(24, 300.0), **OPTIONS)
    each = (5 * 1.0 + 5.5 * 0.8) / 1000
    assert frontier_kg([clean, dirty], 0.05, per_run=True) == pytest.approx(each * 100 + each * 300)
