"""Runs longer than the plan horizon, and the reasons a plan gives for a job it does not place.

A run longer than the horizon may start at any hour of it and end after it: its window's carbon after the forecast
is the forecast's last day repeated, its capacity after the horizon that of the horizon's last hour. Every unplaced
reason is checked against the problem by plain loops, and a capacity reason also by planning again with room: the
job is then placed. The operating loop (replay executor) plans a 720-hour job on an idle fleet, starts it by its
latest start and ends it by its deadline.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from scheduling.executors.replay import ReplayExecutor
from scheduling.output.plan_store import read_plan
from scheduling.planning.candidates import Evaluator
from scheduling.planning.lp import solve_lp
from scheduling.planning.policies.registry import make_policy
from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions
from scheduling.queue.intake import submit_file
from scheduling.service import DEFAULT_DEADLINE_RESERVE
from tests.scheduling.test_loop import _hour, _state
from tests.scheduling.test_planner import toy_problem

HOUR = pd.Timedelta(hours=1)


def _intensity(F: np.ndarray, h: int, c: int) -> float:
    """The intensity a plan assumes at hour h (from now) on cluster c: the forecast inside it, the forecast's last
    day (24 hours, or all of it when shorter) repeated after it, at the same hour of day."""
    H = len(F)
    if h < H:
        return float(F[h, c])
    day = min(24, H)
    return float(F[H - day + (h - H) % day, c])


def _window_kg(p, j: int, k: int, s: int, c: int) -> float:
    d = p.dur[j, k, c]
    whole = math.floor(d + 1e-9)
    frac = d - whole if d - whole >= 1e-9 else 0.0
    g = sum(_intensity(p.forecast, h, c) for h in range(s, s + whole)) + frac * _intensity(p.forecast, s + whole, c)
    return p.kw[j, k, c] * g / 1000.0


def _fits(free: np.ndarray, gpu: int, s: int, occ: int, c: int) -> bool:
    """Room for a run of `occ` hours from s on cluster c: every hour inside the horizon (after it, the horizon's
    last hour stands for the capacity, and that hour is inside the window of a run that leaves the horizon)."""
    return all(free[h, c] >= gpu for h in range(s, min(s + occ, free.shape[0])))


def test_a_run_longer_than_the_horizon_has_a_candidate_at_every_start_hour():
    """H = 30 on two clusters with hourly intensities; job 0 runs 50.5 h (deadline 70: timely up to hour 19), job 1
    20 h (inside the horizon: starts up to hour 10). Cluster 0 has no room at hour 25. Every candidate's carbon,
    capacity, horizon and deadline masks equal plain loops."""
    rng = np.random.default_rng(3)
    H = 30
    F = rng.uniform(20, 500, size=(H, 2))
    free = np.full((H, 2), 1000)
    free[25, 0] = 500
    p = toy_problem(F, free, gpu=[1000, 1000], dur=[[50.5, 50.5], [20, 20]], kw=[[1.2, 0.8], [1, 1]], deadline=[70, 60])
    ev = Evaluator(p)
    for j, last in ((0, H - 1), (1, H - 20)):
        v = ev.view(j, p.free)
        for s, c in itertools.product(range(H), range(2)):
            d = p.dur[j, 0, c]
            occ = math.ceil(d - 1e-9)
            assert v.base_ok[0, s, c] == (s <= last), (j, s, c)
            assert v.timely[0, s, c] == (s <= math.floor(p.deadline_rel[j] - d + 1e-9)), (j, s, c)
            assert v.cap_ok[0, s, c] == _fits(p.free, 1000, s, occ, c), (j, s, c)
            assert v.cost[0, s, c] == pytest.approx(_window_kg(p, j, 0, s, c), rel=1e-12)
    v = ev.view(0, p.free)
    assert not v.cap_ok[0, 25, 0] and v.cap_ok[0, 26, 0] and v.feasible[0, 19, 1] and not v.feasible[0, 20, 1]


@pytest.mark.parametrize("name", ["priority", "rolling-lp", "optimum"])
def test_a_run_longer_than_the_horizon_is_planned_at_its_cheapest_start(name):
    """A 40-hour run (deadline 60) on a 6-hour horizon, beside a 2-hour one (deadline 6), one GPU per cluster: the
    long run is placed, on time, at the start with the least carbon over its whole window (the forecast's 6 hours
    repeated after the horizon), and the short one on the other cluster."""
    F = [[100, 50], [90, 60], [80, 70], [70, 80], [60, 90], [50, 100]]
    p = toy_problem(
        F, [[1000, 1000]] * 6, gpu=[1000, 1000], dur=[[2, 2], [40, 40]], kw=[[1, 1], [1, 1]], deadline=[6, 60]
    )
    out = make_policy(name, learn_prices=False).plan(p)
    assert out.placed.all() and not out.late.any()
    assert out.c[0] != out.c[1] or out.s[0] >= out.s[1] + 40
    s, c = int(out.s[1]), int(out.c[1])
    assert out.cost[1] == pytest.approx(_window_kg(p, 1, 0, s, c), rel=1e-9)
    if name != "rolling-lp":  # (rolling-lp weighs both jobs in its LP; the short one may take the best slot)
        best = min(_window_kg(p, 1, 0, s2, c2) for s2, c2 in itertools.product(range(6), range(2)))
        assert out.cost[1] == pytest.approx(best, rel=1e-9)


def test_the_forecast_reaches_as_far_as_the_longest_hosted_run():
    """A job runs 40 h on cluster 0 and would run a million hours on cluster 1, which does not host it: the
    forecast is continued for the 40 hours only (not a million rows), and the job is planned on cluster 0."""
    p = toy_problem(
        [[100, 50]] * 6, [[1000, 1000]] * 6, gpu=[1000], dur=[[40, 1e6]], kw=[[1, 1]], deadline=[60], allowed=[[1, 0]]
    )
    assert Evaluator(p).Fp.shape[0] == 6 + max(6, 40) + 2
    for name in ("priority", "rolling-lp"):
        out = _plan(name, p)
        assert out.placed[0] and out.c[0] == 0 and out.cost[0] == pytest.approx(_window_kg(p, 0, 0, int(out.s[0]), 0))


def test_lp_capacity_rows_end_with_the_horizon():
    """Two 50-hour runs on one GPU, a 30-hour horizon, deadlines far ahead, the cleanest hour now: any two starts
    inside the horizon overlap from the later start to the horizon's end, so the LP runs only one of them there
    (the one drawing less). rolling-lp starts it now and reports the other as lacking room in the horizon (its
    deadline allows a start after it), neither as late nor as lacking room now."""
    F = [[10]] + [[100]] * 29
    p = toy_problem(F, [[1000]] * 30, gpu=[1000, 1000], dur=[[50], [50]], kw=[[1], [2]], deadline=[200, 200])
    lp = solve_lp(p)
    held = np.zeros(30)
    for x, s in zip(lp.x, lp.s):
        held[s:] += x * 1000
    assert held.max() <= 1000 + 1e-6 and lp.u == pytest.approx([0.0, 1.0])
    hourly = RollingLPOptions(capacity_factor=1.0, expected_arrivals_h=0, hourly_rows=None)  # rows as the LP's
    out = RollingLP(hourly).plan(p, now_hour=0)
    assert out.placed.tolist() == [True, False] and out.status[0] == "dispatched" and out.s[0] == 0
    assert out.reason[1] == "no_capacity_in_horizon"


# ------------------------------------------------------------------------------------------------ unplaced reasons
LP_POLICIES = ("rolling-lp", "optimum")  # a job without a start is one the LP runs late


def _latest_start(p, j: int) -> float:
    """Job j's latest timely start over the (option, cluster) pairs that host it, by plain loops; -inf: none."""
    lat = [
        math.floor(p.deadline_rel[j] - p.dur[j, k, c] + 1e-9)
        for k, c in itertools.product(range(p.n_options), range(p.n_clusters))
        if p.allowed[j, c] and math.isfinite(p.dur[j, k, c])
    ]
    return max(lat) if lat else -math.inf


def _free_after(p, out) -> np.ndarray:
    """The GPUs every placed job leaves free (its whole run from its start, cut at the horizon)."""
    free = p.free.astype(np.int64).copy()
    for i in np.flatnonzero(out.placed):
        occ = math.ceil(p.dur[i, out.k[i], out.c[i]] - 1e-9)
        free[out.s[i] : out.s[i] + occ, out.c[i]] -= p.gpu_total[i]
    return free


def _hosts(p, j: int) -> list[tuple[int, int]]:
    return [
        (k, c)
        for k, c in itertools.product(range(p.n_options), range(p.n_clusters))
        if p.allowed[j, c] and math.isfinite(p.dur[j, k, c])
    ]


def _with_room(p):
    """The same problem with room for every job at every hour (each cluster as large as all jobs together)."""
    import dataclasses

    return dataclasses.replace(p, free=np.full_like(p.free, int(p.gpu_total.sum()) + 1000))


def _check_reasons(name: str, p, out) -> None:
    """Every unplaced reason true of the problem (plain loops), and each capacity reason caused by capacity."""
    roomy = make_policy(name, learn_prices=False).plan(_with_room(p)) if name != "rolling-lp" else None
    if name == "rolling-lp":
        roomy = RollingLP(RollingLPOptions(capacity_factor=1.0, expected_arrivals_h=0)).plan(_with_room(p), now_hour=0)
    free = _free_after(p, out)
    for j in np.flatnonzero(~out.placed):
        j, why = int(j), out.reason[j]
        hosts = _hosts(p, j)
        if why == "no_hostable_cluster":
            assert not hosts, (name, j)
            continue
        assert hosts, (name, j, why)
        if why == "no_capacity_now":  # nothing fits now, on any option and cluster; with room it is placed now
            assert p.release[j] == 0
            fits = [
                (k, c) for k, c in hosts if _fits(free, int(p.gpu_total[j]), 0, math.ceil(p.dur[j, k, c] - 1e-9), c)
            ]
            assert not fits, (name, j, fits)
            assert roomy.placed[j], (name, j)
        elif why == "no_capacity_in_horizon":  # nothing fits at any start; with room it is placed
            if name in LP_POLICIES:  # the LP's view: timely starts lie past the horizon too
                assert _latest_start(p, j) >= p.hours, (name, j)
            else:
                fits = [
                    (k, s, c)
                    for (k, c), s in itertools.product(hosts, range(max(int(p.release[j]), 0), p.hours))
                    if _fits(free, int(p.gpu_total[j]), s, math.ceil(p.dur[j, k, c] - 1e-9), c)
                ]
                assert not fits, (name, j, fits)
            assert roomy.placed[j], (name, j)
        elif why == "lp_late":
            assert name in LP_POLICIES and _latest_start(p, j) < p.hours, (name, j)
        elif why == "released_later":
            assert p.release[j] > 0, (name, j)
        elif why == "release_after_horizon":
            assert p.release[j] >= p.hours, (name, j)
        else:
            raise AssertionError(f"{name}: job {j}: unexpected reason {why!r}")


def _plan(name: str, p):
    if name == "rolling-lp":
        return RollingLP(RollingLPOptions(capacity_factor=1.0, expected_arrivals_h=0)).plan(p, now_hour=0)
    return make_policy(name, learn_prices=False).plan(p)


@pytest.mark.parametrize("name", ["rolling-lp", "priority"])
def test_each_unplaced_reason_is_true(name):
    """One job per reason, on two clusters of two GPUs over 8 hours: job 0 is hosted nowhere; job 1 (due now)
    finds no GPU free now, two from hour 1; job 2 arrives at hour 3 but was due at hour 2 (rolling-lp) or
    arrives after the horizon (priority); job 3 runs 30 h on an idle fleet (placed: never "no capacity")."""
    H = 8
    free = np.full((H, 2), 2000)
    free[0] = 0
    release = [0, 0, 3 if name == "rolling-lp" else H, 0]
    allowed = np.ones((4, 2), dtype=bool)
    allowed[0] = False
    p = toy_problem(
        [[100, 200]] * H,
        free,
        gpu=[1000, 2000, 1000, 1000],
        dur=[[2, 2], [2, 2], [2, 2], [30, 30]],
        kw=[[1, 1]] * 4,
        deadline=[6, 2, 2, 60],
        release=release,
        allowed=allowed,
    )
    out = _plan(name, p)
    expected = {
        "rolling-lp": ["no_hostable_cluster", "no_capacity_now", "released_later"],
        "priority": ["no_hostable_cluster", None, "release_after_horizon"],
    }[name]
    assert out.reason[:3] == expected
    assert out.placed[3] and not out.late[3]
    _check_reasons(name, p, out)


@pytest.mark.parametrize(("name", "seed"), itertools.product(["rolling-lp", "priority", "optimum"], range(6)))
def test_every_unplaced_reason_is_true_on_crowded_fleets(name, seed):
    """Random crowded problems with runs up to three horizons long: every reason given is true."""
    rng = np.random.default_rng(700 + seed)
    N, H, C = 14, 10, 2
    dur = rng.uniform(1, 30, size=(N, 1, C)) * np.array([1.0, 1.2])[None, :, None]
    allowed = rng.random((N, C)) < 0.9
    allowed[rng.integers(0, N)] = False
    p = toy_problem(
        rng.uniform(20, 500, size=(H, C)),
        rng.integers(1, 4, size=(H, C)) * 1000,
        gpu=rng.choice([500, 1000, 2000], size=N),
        dur=dur,
        kw=np.ones_like(dur) * np.array([1.0, 0.8])[None, :, None],
        deadline=dur.min(axis=(1, 2)) * rng.uniform(1.0, 2.5, size=N),
        allowed=allowed,
    )
    out = _plan(name, p)
    assert (~out.placed).any()  # crowded: the reasons are exercised
    _check_reasons(name, p, out)


# ------------------------------------------------------------------------------------------------ the loop
T = pd.Timestamp("2021-07-15T12:00:00Z")
RUN_H = 720.0
DEADLINE = T + pd.Timedelta(days=46)
JOB = "ml-team/long-720h"


def test_a_720_hour_job_is_planned_starts_by_its_latest_start_and_ends_by_its_deadline(
    tmp_warehouse, tmp_path, data_dir
):
    """The operating loop on an idle fleet (replay executor, true run time 720 h): a 1-GPU job that cannot
    checkpoint, 720 h on its one cluster at full power, deadline 46 days after submission. Every plan places it
    (dispatched or tentative, never "no capacity"); planned again at its latest start at full power -- the
    planning deadline keeps the deadline reserve's share of the run spare -- it starts then at the latest, and
    the hour after its end the queue has it finished, before its deadline."""
    spec = tmp_path / "long.yaml"
    spec.write_text(
        f"""jobs:
  - tenant: ml-team
    job_id: long-720h
    submitted_at: {T.isoformat()}
    gpus: 1
    gpu_models: [V100M32]
    allowed_regions: [eu-north]
    home_region: eu-north
    cpu_milli: 8000
    memory_mib: 32768
    job_type: ResNet-50 (batch size 64)
    est_duration_h: {RUN_H}
    deadline: {DEADLINE.isoformat()}
    input_gb: 10
    image: registry.example/train:latest
    command: [python, train.py]
"""
    )
    report = submit_file(spec, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 1, report.rejected
    truth = tmp_path / "truth.csv"
    pd.DataFrame({"job_id": [JOB], "true_duration_h": [RUN_H]}).to_csv(truth, index=False)
    executor = ReplayExecutor(db_path=tmp_warehouse, truth=truth, failure_rate=0.0)
    # the latest start the plan keeps: the planning deadline (the deadline less the reserve's share of the run,
    # JobTable) less the run at full power
    latest = (
        DEADLINE
        - pd.Timedelta(hours=min(DEFAULT_DEADLINE_RESERVE * RUN_H, (DEADLINE - T) / HOUR - RUN_H))
        - RUN_H * HOUR
    )
    assert latest == T + 240 * HOUR
    started = None
    for at in (T, T + HOUR, T + 2 * HOUR, latest):
        out = _hour(tmp_warehouse, tmp_path, data_dir, at, executor)
        plan = read_plan(out.plan["plan_id"], db_path=tmp_warehouse)
        assert JOB not in set(plan.unplaced["job_id"]), plan.unplaced
        row = plan.assignments.set_index("job_id").loc[JOB]
        assert row["cluster"] == "eun-v100m32" and row["start_time"] <= latest and row["end_time"] <= DEADLINE
        assert not row["checkpointing"]  # runs in one piece
        if row["status"] == "dispatched":
            started = at
            break
    assert started is not None and started <= latest
    runs = executor.runs()
    run = runs[runs["job_id"] == JOB].iloc[0]
    assert run["start_time"] == started and run["true_end"] <= DEADLINE
    # past the end: the loop's sync reads the executor's events, and the queue has the job finished
    after = run["true_end"].ceil("h") + HOUR
    _hour(tmp_warehouse, tmp_path, data_dir, after, executor)
    assert _state(tmp_warehouse)[JOB][0] == "finished"
