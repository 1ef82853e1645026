"""Preemption for carbon and for due jobs (`scheduling.planning.pausing`) against hand-computed runs: one cluster,
one 300 W option, a forecast dirty for 6 hours and clean after; a 10-hour run 4 hours in is paused until the clean
hours when its deadline allows, and kept running when it does not, when the grid is flat, when its job does not
checkpoint, when the recap raised it, when it has been preempted enough, or when its executor cannot preempt; it
is offered to a due job's plan only while resuming it from the next hour keeps its deadline."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from scheduling.planning.pausing import Pausing, evictable_running, explain_pause, pause_running
from scheduling.planning.recap import RunTimeError

NOW = pd.Timestamp("2021-07-15T12:00Z")
FLEET = SimpleNamespace(names=["c0"], pue=[1.0])
OPTIONS = (np.array([[1.0]]), np.array([[300.0]]), np.array([[300.0]]))  # time factor, W per GPU, limit W
EXACT = RunTimeError(0.0, 1e-9, 100)  # run times as planned
DIRTY_THEN_CLEAN = np.array([[500.0]] * 6 + [[100.0]] * 42)


def _case(deadline_h=40.0, reason="keep", **flags):
    recaps = pd.DataFrame(
        {
            "job_id": ["t/a"], "plan_id": ["p@1"], "attempt": [1], "cluster": ["c0"],
            "deadline": [NOW + pd.Timedelta(hours=deadline_h)], "to_limit_w": [300.0], "reason": [reason],
            "work_h": [10.0], "work_done_h": [4.0],
        }
    )  # fmt: skip
    runs = pd.DataFrame(
        {"job_id": ["t/a"], "num_gpu": [2], "gpu_milli": [1000], "checkpointing": [True], "preemptions": [0],
         "work_done": [0.0], "preempt": [True]}
    )  # fmt: skip
    for key, value in flags.items():
        runs[key] = [value]
    return recaps, runs


def _pause(recaps, runs, forecast=DIRTY_THEN_CLEAN):
    return pause_running(recaps, runs, FLEET, OPTIONS, forecast, NOW, EXACT, Pausing(for_carbon=True, save_h=0.25))


def test_a_run_in_a_dirty_stretch_waits_for_the_clean_hours():
    out = _pause(*_case())
    assert len(out) == 1
    row = out.iloc[0]
    # 0.6 kW; kept: 6 h at 500 g = 1.8 kg; paused: restore 0.25 h + 6 h left + 0.25 h lost, at 100 g from +6 h
    assert row["kgco2e_kept"] == pytest.approx(0.6 * 6 * 500 / 1000)
    assert row["kgco2e"] == pytest.approx(0.6 * 6.5 * 100 / 1000)
    assert row["resume_at"] == NOW + pd.Timedelta(hours=6)
    assert row["work_done"] == pytest.approx((4 - 0.25) / 10) and row["reason"] == "carbon"


def test_the_resumed_run_must_keep_its_deadline_with_slack():
    # resumed at +r h it must end by the deadline at r + 0.25 + 1.1 x 6.25 h, plus 1 h of slack: r <= D - 8.125
    early = _pause(*_case(deadline_h=14.0)).iloc[0]  # r <= 5.875: +5, one dirty hour then 5.5 clean ones
    assert early["resume_at"] == NOW + pd.Timedelta(hours=5)
    assert early["kgco2e"] == pytest.approx(0.6 * (1 * 500 + 5.5 * 100) / 1000)
    first = _pause(*_case(deadline_h=9.2)).iloc[0]  # r <= 1.075: +1, still 11.7 % below running on
    assert first["kgco2e"] == pytest.approx(0.6 * (5 * 500 + 1.5 * 100) / 1000)
    assert _pause(*_case(deadline_h=9.0)).empty  # no hour to resume at


@pytest.mark.parametrize(
    "case",
    [
        {"reason": "at_risk"},
        {"checkpointing": False},
        {"preemptions": 2},
        {"preempt": False},
    ],
)
def test_runs_that_may_not_pause_keep_running(case):
    reason = case.pop("reason", "keep")
    assert _pause(*_case(reason=reason, **case)).empty


def test_pausing_for_carbon_is_opt_in():
    assert pause_running(*_case(), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, Pausing(save_h=0.25)).empty


def test_a_flat_grid_pays_nothing_for_the_overhead():
    assert _pause(*_case(), forecast=np.full((48, 1), 300.0)).empty


def test_a_resumed_job_keeps_the_share_it_had_before():
    recaps, runs = _case(work_done=0.5)  # this run is the second half of the job
    assert _pause(recaps, runs).iloc[0]["work_done"] == pytest.approx(0.5 + 0.5 * (4 - 0.25) / 10)


def test_a_run_on_a_drained_node_moves_from_the_next_hour_whatever_the_carbon():
    recaps, runs = _case()
    out = pause_running(
        recaps, runs, FLEET, OPTIONS, np.full((48, 1), 300.0), NOW, EXACT, Pausing(save_h=0.25), frozenset({"t/a"})
    )
    assert len(out) == 1 and out.iloc[0]["reason"] == "drained"
    assert out.iloc[0]["resume_at"] == NOW + pd.Timedelta(hours=1)
    # kept running: 6 h at 300 g; moved: restore + the rest + the lost work from +1 h, 6.5 h at 300 g
    assert out.iloc[0]["kgco2e"] == pytest.approx(0.6 * 6.5 * 300 / 1000)
    # resumed at +1 h it must still end by the deadline: 1 + 7.125 + 1 h
    late = _case(deadline_h=9.0)
    assert pause_running(*late, FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, Pausing(save_h=0.25),
                         frozenset({"t/a"})).empty  # fmt: skip


def test_a_run_is_evictable_for_a_due_job_while_resuming_next_hour_keeps_its_deadline():
    settings = Pausing(save_h=0.25, for_deadline=True)
    out = evictable_running(*_case(deadline_h=9.2), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, settings)
    assert len(out) == 1
    row = out.iloc[0]
    assert row["reason"] == "deadline" and row["resume_at"] == NOW + pd.Timedelta(hours=1)
    # resumed at +1 h: restore 0.25 + 6 h left + 0.25 h lost = 6.5 h, 5 of them dirty; 2 GPUs over those hours
    assert row["kgco2e"] == pytest.approx(0.6 * (5 * 500 + 1.5 * 100) / 1000)
    assert row["cost"] == pytest.approx(2 * 1000 * 6.5)
    assert row["work_done"] == pytest.approx((4 - 0.25) / 10)
    # it must end by the deadline at its p99 run time, without the carbon pause's margins: 1 + 0.25 + 6.25 = 7.5 h
    assert len(evictable_running(*_case(deadline_h=7.51), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, settings)) == 1
    assert evictable_running(*_case(deadline_h=7.49), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, settings).empty
    # with the pause's margins instead: 1 + 0.25 + 1.1 x 6.25 + 1 h = 9.125 h
    margins = Pausing(save_h=0.25, for_deadline=True, evict_slack_factor=1.1, evict_slack_h=1.0)
    assert len(evictable_running(*_case(deadline_h=9.2), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, margins)) == 1
    assert evictable_running(*_case(deadline_h=9.0), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, margins).empty
    assert evictable_running(*_case(reason="at_risk"), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, settings).empty
    assert evictable_running(*_case(), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT, Pausing(save_h=0.25)).empty


def test_a_jobs_own_checkpoint_time_and_preemption_cap_replace_the_settings():
    settings = Pausing(save_h=0.25, for_deadline=True)
    slow = evictable_running(*_case(checkpoint_overhead_min=30.0), FLEET, OPTIONS, DIRTY_THEN_CLEAN, NOW, EXACT,
                             settings).iloc[0]  # fmt: skip
    # 30 min to write and as long to read: restore 0.5 + 6 h left + 0.5 h lost
    assert slow["save_h"] == 0.5 and slow["cost"] == pytest.approx(2 * 1000 * 7.0)
    assert slow["work_done"] == pytest.approx((4 - 0.5) / 10)
    assert _pause(*_case(preemptions=2, max_preemptions=5)).iloc[0]["reason"] == "carbon"  # the default cap is 2
    assert _pause(*_case(max_preemptions=0)).empty


@pytest.mark.parametrize("reason", ["keep", "at_risk"])
def test_a_run_whose_chunk_is_done_stops_at_its_checkpoint_whatever_the_carbon(reason):
    """A long job's run (`planning.chunks`) stops once its chunk's end is reached, on a flat grid, with pausing for
    carbon off, at risk or not, even past its preemption cap: the rest resumes from the next hour. Before its chunk
    ends, or on an executor that cannot preempt, it runs on."""
    flat, settings = np.full((48, 1), 300.0), Pausing(save_h=0.25)
    done = _case(reason=reason, chunk_end=NOW - pd.Timedelta(minutes=5), preemptions=2)
    out = pause_running(*done, FLEET, OPTIONS, flat, NOW, EXACT, settings)
    assert len(out) == 1 and out.iloc[0]["reason"] == "chunk"
    assert out.iloc[0]["resume_at"] == NOW + pd.Timedelta(hours=1)
    assert out.iloc[0]["work_done"] == pytest.approx((4 - 0.25) / 10)  # the work by the checkpoint signal
    # the rest from +1 h: restore 0.25 + 6 h left + 0.25 h lost at 300 g, 2 GPUs at 300 W
    assert out.iloc[0]["kgco2e"] == pytest.approx(0.6 * 6.5 * 300 / 1000)
    assert "its chunk of work is done" in explain_pause(out.iloc[0].to_dict())
    later = _case(reason=reason, chunk_end=NOW + pd.Timedelta(minutes=5))
    assert pause_running(*later, FLEET, OPTIONS, flat, NOW, EXACT, settings).empty
    stuck = _case(reason=reason, chunk_end=NOW - pd.Timedelta(minutes=5), preempt=False)
    assert pause_running(*stuck, FLEET, OPTIONS, flat, NOW, EXACT, settings).empty
    whole = _case(reason=reason, chunk_end=pd.NaT)
    assert pause_running(*whole, FLEET, OPTIONS, flat, NOW, EXACT, settings).empty
