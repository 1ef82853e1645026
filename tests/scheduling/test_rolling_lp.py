"""`rolling-lp` (MPC with the optimum's LP) on a tiny hand-made case."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduling.evaluation.ablations import ClairvoyantArrivals, DefaultPowerReduction, WarmStarted
from scheduling.planning.candidates import due_now
from scheduling.planning.job_priority import priority_parts
from scheduling.planning.lp import solve_lp
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.policies.registry import make_policy
from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions, _thinned_expected
from scheduling.planning.problem import PriorityWeights
from tests.scheduling.test_planner import toy_problem


def test_rolling_lp_picks_green_region_and_hour_and_starts_forced_job():
    """Two regions, four hours, one GPU each; 1 kW, 1 h jobs. Region 0: 100 g all day; region 1: 300 g at hours
    0-1, 20 g at hour 2, 300 g at hour 3.
    * job 0 (deadline 4): best is region 1 at hour 2 (0.02 kg) -> not started now, tentative (s=2, c=1);
    * job 1 (deadline 1): its latest start is now -> must start now; cheapest now is region 0 (0.1 kg);
    * job 2 (deadline 4): region 1 at hour 2 is taken by job 0 in the LP; next best is region 0 at any hour
      (0.1 kg); hour 0 in region 0 is taken by job 1, so it waits (s > 0, c = 0)."""
    F = [[100, 300], [100, 300], [100, 20], [100, 300]]
    free = [[1000, 1000]] * 4
    p = toy_problem(F, free, gpu=[1000, 1000, 1000], dur=[[1, 1]] * 3, kw=[[1, 1]] * 3, deadline=[4, 1, 4])
    assert isinstance(make_policy("rolling-lp"), RollingLP) and isinstance(make_policy("rolling-lp"), PlacementPolicy)
    # one GPU per region: the default head-room would leave no whole GPU
    pol = RollingLP(RollingLPOptions(capacity_factor=1.0))
    out = pol.plan(p, now_hour=0)
    # job 1: forced now, in the green-er region now (region 0)
    assert out.placed[1] and out.s[1] == 0 and out.c[1] == 0 and not out.late[1]
    assert out.status[1] == "dispatched" and out.cost[1] == pytest.approx(0.1)
    # job 0: the green region and hour (region 1 at hour 2), not started now
    assert (out.s[0], out.c[0]) == (2, 1) and out.status[0] == "tentative"
    assert out.cost[0] == pytest.approx(0.02)
    # job 2: not started now, region 0 later
    assert out.s[2] > 0 and out.c[2] == 0
    assert out.stats["n_started"] == 1 and out.stats["n_forced"] == 1
    assert pol.last.objective_kg == pytest.approx(0.02 + 0.1 + 0.1)


def test_rolling_lp_starts_job_whose_lp_mass_is_now():
    # hour 0 is the cleanest: the LP starts the job now in region 1, although its deadline leaves room
    p = toy_problem(
        [[100, 10], [100, 300], [100, 300]], [[1000, 1000]] * 3, gpu=[1000], dur=[[1, 1]], kw=[[1, 1]], deadline=[3]
    )
    out = RollingLP(RollingLPOptions(capacity_factor=1.0)).plan(p, now_hour=0)
    assert (out.s[0], out.c[0]) == (0, 1) and out.status[0] == "dispatched"
    assert out.stats["n_forced"] == 0


def test_rolling_lp_capacity_price_folded_into_intensity():
    # a price of 2e-4 kg per GPU-milli-hour on region 1 at hour 0 charges a 1000-milli, 1 kW job 0.2 kg there
    # (= +200 g/kWh): region 1 (0.01 + 0.2 kg) is then worse than region 0 (0.1 kg) for a job due now
    from scheduling.planning.policies.rolling_lp import _priced

    p = toy_problem(
        [[100, 10], [100, 300], [100, 300]], [[1000, 1000]] * 3, gpu=[1000], dur=[[1, 1]], kw=[[1, 1]], deadline=[1]
    )
    p.capacity_price = np.array([[0.0, 2e-4], [0.0, 0.0], [0.0, 0.0]])
    q = _priced(p)
    assert q.forecast[0, 1] == pytest.approx(10 + 200) and q.forecast[0, 0] == 100 and p.forecast[0, 1] == 10
    out = RollingLP(RollingLPOptions(capacity_factor=1.0)).plan(p, now_hour=0)
    assert (out.s[0], out.c[0]) == (0, 0)


@pytest.mark.parametrize("max_power_candidates", [None, 1])
def test_rolling_lp_power_option_and_explains_every_decision(max_power_candidates):
    """The capped option emits less within the deadline: default 1 h at 1 kW from hour 0 = 0.08 kg; capped 1.5 h
    at 0.6 kW = 0.6 x (80 + 50) / 1000 = 0.078 kg. The LP picks it where it keeps the power options; a plan
    above `max_power_candidates` keeps one option per start and cluster (the least carbon) -- the same answer.
    Every placed job has an explanation, with the LP's value as the optimum counterfactual."""
    from scheduling.domain.plan import EXPLANATION_KEYS

    p = toy_problem(
        [[80], [100], [100], [300]],
        [[2000]] * 4,
        gpu=[1000, 1000],
        dur=[[[1.0], [1.5]], [[1.0], [1.5]]],
        kw=[[[1.0], [0.6]], [[1.0], [0.6]]],
        deadline=[3, 4],
        limit_w=[[300.0], [180.0]],
    )
    pol = RollingLP(RollingLPOptions(capacity_factor=1.0, max_power_candidates=max_power_candidates))
    out = pol.plan(p, now_hour=0)
    assert pol.last.power_reduction == ("none" if max_power_candidates is None else "cheapest")
    assert (out.s == 0).all() and (out.k == 1).all() and out.cost == pytest.approx([0.078, 0.078])
    assert out.placed.all() and len(out.explanations) == 2
    for e in out.explanations:
        assert set(EXPLANATION_KEYS) <= set(e) and e["policy"] == "rolling-lp"
        assert e["counterfactuals"]["optimum_kgco2e"] is not None
    assert out.explanations[0]["power"]["limit_w"] == 180.0


@pytest.mark.parametrize(
    "max_power_candidates,reduction,cluster", [(None, "cheapest", 1), (1, "cheapest", 1), (1, "default", 0)]
)
def test_rolling_lp_power_reduction_keeps_the_least_carbon_option(max_power_candidates, reduction, cluster):
    """At the default limit cluster 0 is cleaner (1 kW x 1 h x 100 g = 0.1 kg vs 0.12 kg), but capping saves much on
    cluster 1's GPUs (0.5 kW, 1.2 h: 0.5 x (120 + 0.2 x 130) = 0.073 kg) and nothing on cluster 0's. A plan above
    `max_power_candidates` that keeps the least-carbon option per (start, cluster) finds cluster 1 like the full
    model; one that keeps the default limit only goes to cluster 0 and can only cap there at dispatch."""
    p = toy_problem(
        [[100, 120], [110, 130], [120, 140], [130, 150]],
        [[1000, 1000]] * 4,
        gpu=[1000],
        dur=[[[1.0, 1.0], [1.05, 1.2]]],
        kw=[[[1.0, 1.0], [0.95, 0.5]]],
        deadline=[3],
        limit_w=[[300.0, 300.0], [250.0, 150.0]],
    )
    options = RollingLPOptions(
        capacity_factor=1.0, max_power_candidates=max_power_candidates, standby_pool=False, expected_arrivals_h=0
    )
    pol = DefaultPowerReduction(options) if reduction == "default" else RollingLP(options)
    out = pol.plan(p, now_hour=0)
    assert pol.last.power_reduction == ("none" if max_power_candidates is None else reduction)
    assert pol.last.default_power_only == (reduction == "default" and max_power_candidates is not None)
    assert out.placed[0] and out.s[0] == 0 and out.c[0] == cluster
    assert out.cost[0] == pytest.approx(0.073 if cluster == 1 else 0.1)


def test_solve_lp_rejects_an_unknown_power_reduction():
    p = toy_problem([[100]], [[1000]], gpu=[1000], dur=[[1.0]], kw=[[1.0]], deadline=[1])
    with pytest.raises(ValueError, match="power_reduction"):
        solve_lp(p, max_candidates=0, power_reduction="fastest")


def test_rolling_lp_defers_the_tail_of_a_backlog_above_its_job_budget():
    """With a budget of two jobs, the LP plans the two first in priority order (the two due now: lowest urgency)
    and defers the third (deadline 4) to the next hour."""
    p = toy_problem(
        [[100, 300]] * 4, [[2000, 2000]] * 4, gpu=[1000] * 3, dur=[[1, 1]] * 3, kw=[[1, 1]] * 3, deadline=[1, 4, 1]
    )
    out = RollingLP(RollingLPOptions(capacity_factor=1.0, max_lp_jobs=2)).plan(p, now_hour=0)
    assert out.placed[0] and out.placed[2] and (out.s[[0, 2]] == 0).all()
    assert not out.placed[1] and out.reason[1] == "deferred_lp_budget"
    assert out.stats["n_deferred"] == 1 and out.stats["n_jobs"] == 3
    assert [e["job_id"] for e in out.explanations] == ["j0", "j2"]
    plan = out.to_plan()
    assert plan.unplaced["reason"].tolist() == ["deferred_lp_budget"]


def test_a_job_due_now_is_planned_before_the_budget_defers_anything():
    """Budget one job. j1 (10 h, deadline in 10 h) must start now; by priority it comes after j0 (1 h, deadline in
    2 h: it may still wait an hour), since its declared flexibility (2.0) is large. The LP plans the due job and
    defers j0, which an hour later can still start in time; in priority order j1 would be deferred, and late."""
    p = toy_problem([[100, 300]] * 12, [[2000, 2000]] * 12, gpu=[1000] * 2, dur=[[1, 1], [10, 10]],
                    kw=[[1, 1]] * 2, deadline=[2, 10], flex=[0.0, 2.0])  # fmt: skip
    prio = priority_parts(p, PriorityWeights())
    assert prio.priority[0] < prio.priority[1] and due_now(p).tolist() == [False, True]
    out = RollingLP(RollingLPOptions(capacity_factor=1.0, standby_pool=False, max_lp_jobs=1)).plan(p, now_hour=0)
    assert out.placed[1] and out.s[1] == 0
    assert not out.placed[0] and out.reason[0] == "deferred_lp_budget"


def test_expected_arrivals_keep_the_green_slot_for_the_job_that_needs_it():
    """The known job could take region 1's green hour 2 (as in the first test); an expected job (2 kW, release 2,
    deadline 3) can only run at hour 2. With the expected job in the LP the known job leaves the green slot to it
    (0.1 + 0.04 kg beats 0.02 + 0.2 kg). Only known jobs are planned and reported."""
    F = [[100, 300], [100, 300], [100, 20], [100, 300]]
    free = [[1000, 1000]] * 4
    p = toy_problem(F, free, gpu=[1000], dur=[[1, 1]], kw=[[1, 1]], deadline=[4])
    pol = RollingLP(RollingLPOptions(capacity_factor=1.0, standby_pool=False))
    alone = pol.plan(p, now_hour=0)
    assert (alone.s[0], alone.c[0]) == (2, 1)
    p.expected = toy_problem(F, free, gpu=[1000], dur=[[1, 1]], kw=[[2, 2]], deadline=[3], release=[2])
    out = pol.plan(p, now_hour=0)
    assert out.c[0] == 0 and len(out.k) == 1 and out.placed[0]
    assert (pol.last.job < 1).all() and len(pol.last.u) == 1
    assert pol.last.objective_kg == pytest.approx(0.1)  # the known job's carbon only


def test_a_backlog_above_the_budget_sees_its_share_of_the_expected_demand():
    """Two known jobs, a budget of one: the LP plans j0 and sees half of the two expected jobs (each 500 GPU-milli
    and 0.75 kW, both able to run only in region 1's green hour 2): one job of 1000 milli and 1.5 kW. Together the
    expected jobs draw more than j0 (1 kW), so the green slot is theirs and j0 runs in region 0, as with every
    expected job in the LP; the kept job drawing only its own 0.75 kW would leave the slot to j0."""
    F = [[100, 300], [100, 300], [100, 20], [100, 300]]
    free = [[1000, 1000]] * 4
    pol = RollingLP(RollingLPOptions(capacity_factor=1.0, standby_pool=False, max_lp_jobs=1))
    expected = toy_problem(F, free, gpu=[500] * 2, dur=[[1, 1]] * 2, kw=[[0.75, 0.75]] * 2, deadline=[3] * 2,
                           release=[2] * 2)  # fmt: skip
    alone = toy_problem(F, free, gpu=[1000], dur=[[1, 1]], kw=[[1, 1]], deadline=[4])
    alone.expected = expected
    assert pol.plan(alone, now_hour=0).c[0] == 0
    p = toy_problem(F, free, gpu=[1000] * 2, dur=[[1, 1]] * 2, kw=[[1, 1]] * 2, deadline=[4] * 2)
    p.expected = expected
    out = pol.plan(p, now_hour=0)
    assert out.reason[1] == "deferred_lp_budget" and out.c[0] == 0

    thinned = _thinned_expected(p, 0.5).expected
    assert thinned.n_jobs == 1 and thinned.jobs["job_id"].tolist() == ["j0"]
    assert thinned.gpu_total.sum() == expected.gpu_total.sum() and thinned.kw[0, 0, 0] == pytest.approx(1.5)
    unscaled = dataclasses.replace(thinned, gpu_total=expected.gpu_total[:1], kw=expected.kw[:1])
    assert pol.plan(dataclasses.replace(p, expected=unscaled), now_hour=0).c[0] == 1
    assert _thinned_expected(p, 1.0) is p and _thinned_expected(p, 0.1).expected is None


def test_expected_jobs_replay_the_last_hours_of_arrivals_shifted_forward(data_dir):
    import pandas as pd

    from scheduling.evaluation.scenario import build_scenario
    from scheduling.planning.problem import JobTable, abs_hours

    sc = build_scenario(
        start="2021-07-05",
        days=2,
        n_jobs=60,
        regions=3,
        load=0.5,
        seed=3,
        forecasts="naive",
        data_dir=data_dir,
        grid_source="files",
        tail_days=1,
    )
    table: JobTable = sc.table
    now = sc.start + pd.Timedelta(hours=30)
    now_h = abs_hours(now)
    H, C = 48, len(sc.fleet)

    class Context:
        pass

    ctx = Context()
    ctx.table = table
    free = np.tile(sc.fleet.capacity_milli, (H, 1))
    ex = RollingLP(RollingLPOptions(expected_arrivals_h=18)).expected_jobs(ctx, now, free, np.full((H, C), 100.0))
    recent = np.flatnonzero((table.submit_h >= now_h - 18) & (table.submit_h < now_h))
    assert len(recent) and ex.n_jobs == len(recent)
    assert ex.jobs["job_id"].str.startswith("expected:").all()
    assert np.array_equal(ex.release, np.maximum(table.submit_h[recent] + 18 - now_h, 1))
    assert np.allclose(ex.deadline_rel, table.deadline_h[recent] + 18 - now_h)
    none = RollingLP(RollingLPOptions(expected_arrivals_h=0))
    assert none.expected_jobs(ctx, now, free, np.full((H, C), 100.0)) is None

    # the perfect-information reference: the true arrivals of the next hours, at their own times and deadlines
    clair = ClairvoyantArrivals(12).expected_jobs(ctx, now, free, np.full((H, C), 100.0))
    coming = np.flatnonzero((table.submit_h > now_h) & (table.submit_h < now_h + 12))
    assert len(coming) and clair.n_jobs == len(coming)
    assert not set(coming) & set(recent)
    assert np.array_equal(clair.release, np.maximum(table.submit_h[coming] - now_h, 1))
    assert np.allclose(clair.deadline_rel, table.deadline_h[coming] - now_h)
    # no job submitted after now (as in a live plan's table, which holds only the jobs known): nothing to see
    after = sc.start + pd.Timedelta(hours=int(table.submit_h.max() - abs_hours(sc.start)))
    assert ClairvoyantArrivals(12).expected_jobs(ctx, after, free, np.full((H, C), 100.0)) is None


def _hour_later(p, keep):
    """`p` an hour later: the jobs `keep` still pending (the others started), every window one hour shorter."""
    import dataclasses

    import pandas as pd

    jobs = p.jobs.iloc[keep].reset_index(drop=True)
    return dataclasses.replace(
        p,
        now=p.now + pd.Timedelta(hours=1),
        forecast=p.forecast[1:],
        free=p.free[1:],
        hours=p.hours - 1,
        jobs=jobs,
        release=np.maximum(p.release[keep] - 1, 0),
        deadline_rel=p.deadline_rel[keep] - 1,
        gpu_total=p.gpu_total[keep],
        dur=p.dur[keep],
        kw=p.kw[keep],
        allowed=p.allowed[keep],
        transfer_kwh=p.transfer_kwh[keep],
        home=p.home[keep],
    )


def test_warm_start_from_the_last_hour_reaches_the_same_optimum_in_fewer_iterations():
    """80 jobs, 3 clusters that cannot run them all at once: the LP of the next hour (five jobs started, the rest
    one hour nearer their deadlines) started from this hour's basis has the cold solve's optimum, in fewer simplex
    iterations."""
    from scheduling.planning.lp import WarmStart

    rng = np.random.default_rng(7)
    H, C, N = 49, 3, 80
    dur = rng.integers(1, 8, N).astype(float)
    p0 = toy_problem(
        rng.uniform(50, 500, (H, C)),
        np.full((H, C), 6000),
        gpu=[1000] * N,
        dur=np.repeat(dur[:, None], C, axis=1),
        kw=np.ones((N, C)),
        deadline=dur + rng.integers(3, 30, N),
    )
    p1 = _hour_later(p0, np.arange(5, N))
    warm = WarmStart()
    first = solve_lp(p0, hourly_rows=24, warm=warm)
    warm_lp = solve_lp(p1, hourly_rows=24, warm=warm)
    cold = WarmStart()
    cold_lp = solve_lp(p1, hourly_rows=24, warm=cold)
    assert (warm.solves, warm.warm_solves, cold.warm_solves) == (2, 1, 0)
    assert warm.iterations == first.iterations + warm_lp.iterations
    assert warm_lp.objective_kg == pytest.approx(cold_lp.objective_kg, rel=1e-9)
    assert 0 < warm_lp.iterations < cold_lp.iterations
    cols, _, rows, _ = warm.last
    assert len(np.unique(cols)) == len(cols) and len(np.unique(rows)) == len(rows)  # one key per column and row
    # a problem earlier than the last one (a replay going back) starts cold again
    again = solve_lp(p0, hourly_rows=24, warm=warm)
    assert warm.warm_solves == 1 and again.objective_kg == pytest.approx(first.objective_kg, rel=1e-9)


def test_rolling_lp_warm_start_is_used_from_the_second_plan_on():
    F = [[100, 300], [100, 300], [100, 20], [100, 300], [100, 300]]
    p0 = toy_problem(F, [[2000, 2000]] * 5, gpu=[1000] * 3, dur=[[1, 1]] * 3, kw=[[1, 1]] * 3, deadline=[5, 2, 5])
    pol = WarmStarted(RollingLPOptions(capacity_factor=1.0))
    pol.plan(p0, now_hour=0)
    pol.plan(_hour_later(p0, np.array([0, 2])), now_hour=1)
    assert (pol.warm.solves, pol.warm.warm_solves) == (2, 1)
    assert "warm" not in RollingLP()._solve_options()  # off by default: the reported evaluations are cold


@pytest.mark.parametrize("hourly_rows", [24, None])
def test_capacity_matrix_is_the_same_whatever_the_chunk(hourly_rows):
    """The capacity rows built a few candidates at a time equal those built in one go (values, rows, order)."""
    from scheduling.planning.lp import _candidates, _capacity_rows

    rng = np.random.default_rng(3)
    H, C, N = 49, 3, 60
    dur = rng.uniform(0.5, 9, N)
    p = toy_problem(
        rng.uniform(50, 500, (H, C)),
        np.full((H, C), 6000),
        gpu=[1000] * N,
        dur=np.repeat(dur[:, None], C, axis=1),
        kw=np.ones((N, C)),
        deadline=dur + rng.integers(3, 30, N),
    )
    job, k, s, c, *_ = _candidates(p)
    whole = _capacity_rows(p, job, k, s, c, "gpu", hourly_rows, 6, chunk=10**9)
    pieces = _capacity_rows(p, job, k, s, c, "gpu", hourly_rows, 6, chunk=7)
    assert len(job) > 7
    for a, b in zip(whole, pieces):
        if hasattr(a, "toarray"):
            assert (a.indptr == b.indptr).all() and (a.indices == b.indices).all() and (a.data == b.data).all()
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("overdue_last", [True, False])
def test_a_job_that_can_still_meet_its_deadline_goes_before_an_overdue_one(overdue_last):
    """One node with one GPU, three hours. Job 0 is overdue (2 h of work, deadline in 0.5 h: no timely start left),
    job 1 is due now (1 h, deadline in 1 h). Earliest deadline first alone gives the GPU to job 0 and makes job 1
    late too; rolling-lp starts job 1 and leaves job 0 waiting for the capacity the plan leaves. With two GPUs both
    start, job 0 late."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    def plan(gpus: int, **options):
        p = toy_problem(
            [[100]] * 3, [[gpus * 1000]] * 3, gpu=[1000, 1000], dur=[[2], [1]], kw=[[1], [1]], deadline=[0.5, 1]
        )
        agent = ClusterAgent("c0", Cluster(["n0"], [64000], [262144], [gpus], ["V100"]), policy="bestfit")
        pods = [Pod(f"j{i}", 1000, 1024, 1, 1000) for i in range(2)]
        return RollingLP(RollingLPOptions(capacity_factor=1.0, **options)).plan(p, [agent], pods, now_hour=0)

    out = plan(1, overdue_last=overdue_last)
    started = out.placed & (out.s == 0)
    if overdue_last:
        assert started[1] and not out.late[1] and not started[0] and out.reason[0] == "no_capacity_now"
    else:  # earliest deadline first alone: the overdue job takes the GPU, the due one is rejected
        assert started[0] and out.late[0] and not started[1]
    out = plan(2)
    assert (out.placed & (out.s == 0)).all() and out.late[0] and not out.late[1]
