"""Running jobs' power limits: the execution model (`scheduling.domain.execution`) against hand-computed segments;
the replay executor advancing a run at a changed limit, reporting `power_changed`, idempotent per deciding plan;
the exactly-once power log through a crash between the executor's change and its mark; the hourly decision
(`scheduling.planning.recap`) raising a run at risk, lowering one in a dirty hour, keeping a calm one."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.execution import Segment, end_time, work_done_h
from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.power_log import apply_power_changes, read_changes, record_decisions
from scheduling.executors.replay import ReplayExecutor
from scheduling.planning.power_choice import window_intensity_integral
from scheduling.planning.recap import Recapping, RunTimeError, recap_running
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

H = pd.Timedelta(hours=1)
T0 = PLAN_TIME


# ------------------------------------------------------------------------------------------ execution model


def _near(a, b) -> bool:
    """Times equal to the microsecond the executors keep (float hours round at the last digit)."""
    return abs(pd.Timestamp(a) - pd.Timestamp(b)) <= pd.Timedelta(microseconds=1)


def test_work_done_and_end_follow_the_segments():
    segs = [Segment(T0, 1.0), Segment(T0 + 2 * H, 1.25), Segment(T0 + 4 * H, 0.8)]
    # 2 h at 1.0 -> 2; 2 h at 1.25 -> 1.6; then 0.8 h per reference hour
    assert work_done_h(segs, T0 - H) == 0.0
    assert work_done_h(segs, T0 + H) == pytest.approx(1.0)
    assert work_done_h(segs, T0 + 4 * H) == pytest.approx(2.0 + 2.0 / 1.25)
    assert work_done_h(segs, T0 + 5 * H) == pytest.approx(2.0 + 1.6 + 1.0 / 0.8)
    assert end_time(segs, 1.5) == T0 + 1.5 * H
    assert end_time(segs, 3.0) == T0 + 2 * H + 1.25 * H  # one reference hour at 1.25
    assert _near(end_time(segs, 5.0), T0 + 4 * H + pd.Timedelta(hours=(5.0 - 3.6) * 0.8))
    for at in (T0 + 0.3 * H, T0 + 2.5 * H, T0 + 6 * H):  # end_time inverts work_done_h
        assert _near(end_time(segs, work_done_h(segs, at)), at)
    with pytest.raises(ValueError, match="time_factor must be a positive number"):
        work_done_h([Segment(T0, 0.0)], T0)


# ------------------------------------------------------------------------------------------ replay


def _one_run(db, hours=4.0):
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    items = sample_items(1)
    items.loc[0, ["end_time", "est_duration_h"]] = [T0 + hours * H, hours]
    dispatch(plan_id_at(), items, executor, db_path=db)
    return executor, items.loc[0, "job_id"], float(items.loc[0, "power_limit_w"])


def test_replay_runs_at_the_changed_limit_and_reports_it(tmp_warehouse):
    executor, job, limit0 = _one_run(tmp_warehouse)
    decided = plan_id_at(T0 + H)
    # one hour done at the dispatch limit, then 1.5x slower: the 3 h left take 4.5 h
    ref = executor.set_power_limit(job, 150.0, T0 + H, plan_id=decided, time_factor=1.5)
    assert ref is not None
    assert executor.set_power_limit(job, 999.0, T0 + H, plan_id=decided, time_factor=9.0) == ref  # same key: no-op
    assert executor.power_change_ref(decided, job) == ref
    run = executor.runs().iloc[0]
    assert _near(run["true_end"], T0 + 5.5 * H)
    events = executor.sync(T0 + 10 * H)
    assert list(zip(events["event"], events["event_time"], events["power_limit_w"])) == [
        ("dispatched", T0, limit0),
        ("started", T0, limit0),
        ("power_changed", T0 + H, 150.0),
        ("finished", executor.runs().iloc[0]["true_end"], 150.0),
    ]
    assert executor.running(T0 + 2 * H)["power_limit_w"].tolist() == [150.0]
    assert executor.running(T0 + 0.5 * H)["power_limit_w"].tolist() == [limit0]
    # back to the dispatch limit two hours later: 3 h left - 2/1.5 done = 5/3 h at factor 1
    executor.set_power_limit(job, limit0, T0 + 3 * H, plan_id=plan_id_at(T0 + 3 * H), time_factor=1.0)
    assert _near(executor.runs().iloc[0]["true_end"], T0 + 3 * H + pd.Timedelta(hours=3 - 2 / 1.5))
    # no live run: before its start or after its end
    assert executor.set_power_limit(job, 100.0, T0 + 20 * H, plan_id=plan_id_at(T0 + 20 * H)) is None


def test_a_failure_strikes_after_its_share_of_the_work_at_any_limit(tmp_warehouse):
    executor = ReplayExecutor(db_path=tmp_warehouse, sigma=0.0, failure_rate=1.0)
    items = sample_items(1)
    items.loc[0, ["end_time", "est_duration_h"]] = [T0 + 4 * H, 4.0]
    dispatch(plan_id_at(), items, executor, db_path=tmp_warehouse)
    run = executor.runs().iloc[0]
    work = float(run["work_h"])
    assert run["outcome"] == "failed" and 0 < work < 4.0
    change_at = T0 + min(work / 2, 0.5) * H
    executor.set_power_limit(run["job_id"], 120.0, change_at, plan_id=plan_id_at(T0 + H), time_factor=2.0)
    done_h = (change_at - T0) / H
    assert _near(executor.runs().iloc[0]["true_end"], change_at + pd.Timedelta(hours=(work - done_h) * 2.0))


def test_power_log_changes_once_across_a_crash(tmp_warehouse):
    executor, job, limit0 = _one_run(tmp_warehouse, hours=6.0)
    plan = plan_id_at(T0 + 2 * H)
    change = pd.DataFrame(
        [{"job_id": job, "plan_id": plan_id_at(), "attempt": 1, "cluster": "usw-t4", "from_limit_w": limit0,
          "to_limit_w": 140.0, "time_factor": 1.2, "reason": "carbon", "changed": True}]
    )  # fmt: skip
    assert record_decisions(plan, change, {"usw-t4": executor}, tmp_warehouse) == 1
    assert record_decisions(plan, change.assign(to_limit_w=1.0), {"usw-t4": executor}, tmp_warehouse) == 0

    def crash(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after the executor changed the limit, before the mark")

    with pytest.raises(KeyboardInterrupt):
        apply_power_changes(plan, executor, tmp_warehouse, _fault=crash)
    assert read_changes(plan, tmp_warehouse)["status"].tolist() == ["intent"]
    end_after_first = executor.runs().iloc[0]["true_end"]
    again = apply_power_changes(plan, executor, tmp_warehouse)
    assert again["reconciled"] == [job] and not again["sent"]
    assert apply_power_changes(plan, executor, tmp_warehouse)["skipped"] == [job]
    assert executor.runs().iloc[0]["true_end"] == end_after_first
    assert _near(end_after_first, T0 + 2 * H + pd.Timedelta(hours=4 * 1.2))
    events = executor.sync(T0 + 20 * H)
    assert (events["event"] == "power_changed").sum() == 1


# ------------------------------------------------------------------------------------------ decisions


class _Fleet:
    """One cluster with three power options (the planner's `option_arrays` surface), for hand-checkable numbers."""

    def __init__(self):
        self.names = ["c0"]
        self.pue = np.array([1.0])


# three limits of one GPU model: time factor, average power per GPU (W), limit (W)
OPTIONS = (
    np.array([[1.0], [1.05], [1.25]]),
    np.array([[300.0], [240.0], [180.0]]),
    np.array([[300.0], [250.0], [200.0]]),
)


def _run(limit=300.0, hours_planned=10.0, started_h=-4.0, deadline_h=12.0, changes=()):
    return pd.DataFrame(
        [{"job_id": "t/j", "plan_id": plan_id_at(), "attempt": 1, "cluster": "c0", "num_gpu": 1, "gpu_milli": 1000,
          "start_time": T0 + started_h * H, "planned_start": T0 + started_h * H,
          "planned_end": T0 + (started_h + hours_planned) * H, "dispatch_limit_w": limit, "power_limit_w": limit,
          "deadline": T0 + deadline_h * H, "changes": list(changes)}]
    )  # fmt: skip


def _left(work, done, q, mu, sigma):
    """Independent: the q-quantile of a lognormal ratio given that it exceeds done / work, times work, less done."""
    n = NormalDist(mu, sigma)
    lo = n.cdf(np.log(done / work))
    return work * float(np.exp(n.inv_cdf(lo + q * (1 - lo)))) - done


def test_a_run_behind_its_plan_gets_the_limit_that_keeps_its_deadline():
    # planned 10 h at 200 W (factor 1.25: 8 h of work), 6 h done at 200 W = 4.8 h of work
    run = _run(limit=200.0, hours_planned=10.0, started_h=-6.0, deadline_h=5.0)
    errors = RunTimeError(mu=0.05, sigma=0.2)
    out = recap_running(run, _Fleet(), OPTIONS, np.full((48, 1), 100.0), T0, errors).iloc[0]
    assert out["work_h"] == pytest.approx(8.0) and out["work_done_h"] == pytest.approx(4.8)
    # the highest quantile whose work left fits 5 h at the fastest limit (300 W, factor 1)
    fits = [q for q in (0.95, 0.9, 0.75, 0.5) if _left(8.0, 4.8, q, 0.05, 0.2) <= 5.0]
    assert out["quantile"] == fits[0]
    assert out["work_left_h"] == pytest.approx(_left(8.0, 4.8, fits[0], 0.05, 0.2))
    assert out["reason"] == "at_risk" and out["changed"]
    assert out["to_limit_w"] in (300.0, 250.0)
    assert out["projected_end"] <= out["deadline"] < out["projected_end_kept"]
    assert out["time_factor"] == pytest.approx({300.0: 1.0, 250.0: 1.05}[out["to_limit_w"]] / 1.25)


def test_a_resumed_runs_checkpoint_restore_is_neither_work_nor_progress():
    # planned 10.25 h at 200 W: a 15-minute restore, then 10 h = 8 h of work; 6 h in: 5.75 h at 200 W = 4.6 h of work
    run = _run(limit=200.0, hours_planned=10.25, started_h=-6.0, deadline_h=30.0)
    run["restore_h"] = 0.25
    out = recap_running(run, _Fleet(), OPTIONS, np.full((48, 1), 100.0), T0, RunTimeError(0.0, 1e-6)).iloc[0]
    assert out["work_h"] == pytest.approx(8.0) and out["work_done_h"] == pytest.approx(4.6)
    # a limit change during the restore takes effect when the work begins: 300 W from then, 5.75 h = 5.75 h of work
    run["changes"] = [[(T0 - 5.9 * H, 300.0)]]
    out = recap_running(run, _Fleet(), OPTIONS, np.full((48, 1), 100.0), T0, RunTimeError(0.0, 1e-6)).iloc[0]
    assert out["work_done_h"] == pytest.approx(5.75)


def test_a_run_at_risk_waits_an_hour_where_raising_it_then_still_keeps_the_deadline():
    # planned 10 h at 200 W (8 h of work), 4.8 h done: 3.2 h of work left, 4 h at 200 W; exact run times
    exact = RunTimeError(mu=0.0, sigma=1e-6)
    factor = {300.0: 1.0, 250.0: 1.05, 200.0: 1.25}
    draw = {300.0: 0.3, 250.0: 0.24, 200.0: 0.18}

    def pair(a, b):  # independent: hours and kWh running 1 h at a (or to the end), then the rest at b
        first = min(1.0, 3.2 * factor[a])
        rest = (3.2 - first / factor[a]) * factor[b]
        return first + rest, draw[a] * first + draw[b] * rest

    for deadline_h in (3.9, 3.45):
        run = _run(limit=200.0, hours_planned=10.0, started_h=-6.0, deadline_h=deadline_h)
        out = recap_running(run, _Fleet(), OPTIONS, np.full((48, 1), 100.0), T0, exact).iloc[0]
        # at risk: a faster limit for the rest, from now (a = b) or after one more hour at 200 W (a = 200)
        ok = {(a, b): pair(a, b) for a in factor for b in (300.0, 250.0) if a in (b, 200.0)}
        ok = {k: v for k, v in ok.items() if v[0] <= deadline_h}
        (a, b), (hours, kwh) = min(ok.items(), key=lambda kv: kv[1][1])
        assert out["reason"] == "at_risk" and out["kgco2e"] == pytest.approx(kwh * 100 / 1000, rel=1e-4)
        assert out["changed"] == (a != 200.0) and out["to_limit_w"] == a
        assert out["projected_end"] <= out["deadline"] < out["projected_end_kept"]
    assert (a, b) == (250.0, 250.0)  # 3.45 h: waiting no longer keeps it for less; 3.9 h waited (a = 200 W)


def test_a_run_past_its_estimate_has_more_work_left_the_longer_it_runs():
    errors = RunTimeError(mu=0.0, sigma=0.15)
    lefts = []
    for hours_run in (10.0, 12.0, 14.0):  # planned 10 h at 300 W: past its estimate from then on
        run = _run(limit=300.0, hours_planned=10.0, started_h=-hours_run, deadline_h=40.0)
        lefts.append(recap_running(run, _Fleet(), OPTIONS, np.full((60, 1), 100.0), T0, errors).iloc[0])
    for row, hours_run in zip(lefts, (10.0, 12.0, 14.0)):
        assert row["work_left_h"] == pytest.approx(_left(10.0, hours_run, row["quantile"], 0.0, 0.15))
    assert lefts[0]["work_left_h"] > 0.5  # not "almost done" although the estimate has passed


def test_a_dirty_hour_lowers_the_limit_and_the_saving_matches_the_forecast():
    ci = np.full((48, 1), 100.0)
    ci[0] = 500.0  # the next hour is dirty
    run = _run(limit=300.0, hours_planned=10.0, started_h=-4.0, deadline_h=30.0)
    exact = RunTimeError(mu=0.0, sigma=1e-6)  # the run takes its planned time
    out = recap_running(run, _Fleet(), OPTIONS, ci, T0, exact).iloc[0]
    assert out["reason"] == "carbon" and out["changed"] and out["to_limit_w"] == 200.0
    # independent: 6 h of work left; keep = 300 W for 6 h; chosen: 200 W for the dirty hour (0.8 h of work), and the
    # cheapest limit for the rest
    kept = 0.3 * (500 + 5 * 100) / 1000
    assert out["kgco2e_kept"] == pytest.approx(kept, rel=1e-4)
    rest = 6.0 - 1 / 1.25
    best_rest = min(kw * rest * f * 100 for kw, f in ((0.3, 1.0), (0.24, 1.05), (0.18, 1.25)))
    assert out["kgco2e"] == pytest.approx((0.18 * 500 + best_rest) / 1000, rel=1e-4)
    assert out["draw_kw"] == pytest.approx(0.18)
    calm = recap_running(run, _Fleet(), OPTIONS, np.full((48, 1), 100.0), T0, exact, Recapping(min_saving=0.5))
    assert calm.iloc[0]["reason"] == "keep" and not calm.iloc[0]["changed"] and calm.iloc[0]["to_limit_w"] == 300.0
    # a deadline that holds only at a low quantile: no slowing down for carbon
    tight = _run(limit=300.0, hours_planned=10.0, started_h=-4.0, deadline_h=6.3)
    risky = recap_running(tight, _Fleet(), OPTIONS, ci, T0, RunTimeError(mu=0.0, sigma=0.15)).iloc[0]
    assert risky["quantile"] < 0.9 and not (risky["changed"] and risky["reason"] == "carbon")


def test_limits_do_not_flap():
    ci = np.full((48, 1), 100.0)
    ci[0] = 500.0
    exact = RunTimeError(mu=0.0, sigma=1e-6)
    recent = _run(limit=300.0, started_h=-4.0, deadline_h=30.0, changes=[(T0 - 0.5 * H, 300.0)])
    out = recap_running(recent, _Fleet(), OPTIONS, ci, T0, exact).iloc[0]
    assert not out["changed"] and out["reason"] == "keep"  # the last change is younger than min_dwell_h
    many = [(T0 - (10 - i) * 0.1 * H, 300.0) for i in range(6)]
    many[-1] = (T0 - 3 * H, 300.0)
    out = recap_running(_run(started_h=-5.0, deadline_h=30.0, changes=many), _Fleet(), OPTIONS, ci, T0, exact)
    assert not out.iloc[0]["changed"]  # max_changes reached


def test_run_time_error_fits_finished_runs_and_falls_back_until_enough():
    few = RunTimeError.fit([1.1, 0.9, 1.3])
    assert few.ratio(0.5) == pytest.approx(1.0) and few.ratio(0.9) == pytest.approx(1.2)
    ratios = np.exp(np.random.default_rng(0).normal(0.1, 0.15, 500))
    fitted = RunTimeError.fit(ratios)
    assert fitted.runs == 500
    assert fitted.mu == pytest.approx(np.log(ratios).mean()) and fitted.sigma == pytest.approx(
        np.log(ratios).std(ddof=1)
    )
    assert fitted.ratio(0.9) == pytest.approx(np.quantile(ratios, 0.9), rel=0.03)
    assert fitted.ratio(0.9, at_least=1.5) > 1.5  # still running past 1.5x: more than that
    assert window_intensity_integral(np.array([1.0, 2.0]), 0.5, 1.0) == pytest.approx(1.5)


def test_an_executor_that_cannot_change_a_limit_says_so(tmp_path):
    from scheduling.executors.base import UnsupportedAction
    from scheduling.executors.files import FilesExecutor

    files = FilesExecutor(root=tmp_path / "dispatch")
    assert not files.changes_power_limits and ReplayExecutor.changes_power_limits
    with pytest.raises(UnsupportedAction, match="cannot change a running job's power limit"):
        files.set_power_limit("acme/job-0000", 200.0, T0, plan_id=plan_id_at())
    assert files.power_change_ref(plan_id_at(), "acme/job-0000") is None
