"""Planner core on small hand-checkable instances: the LP optimum by hand, priority order, the vectorized
coordinator against a brute-force loop, deadlines and capacity, agents rejecting and re-offering, the Plan
contract."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.plan import ASSIGNMENT_COLUMNS, BINDING_CONSTRAINTS, EXPLANATION_KEYS, Plan
from scheduling.output import plan_store
from scheduling.planning.candidates import Evaluator
from scheduling.planning.coordinator import Coordinator
from scheduling.planning.decision_records import explain_batch, explain_choice
from scheduling.planning.job_priority import priority_parts, range_extrema
from scheduling.planning.lp import _candidates, solve_lp, solve_preemptive_lp
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.policies.carbon_time import CarbonTime
from scheduling.planning.policies.greedy_carbon import GreedyCarbon
from scheduling.planning.policies.optimum import OptimumPolicy
from scheduling.planning.policies.performance_first import PerformanceFirst
from scheduling.planning.policies.priority import PriorityCarbon
from scheduling.planning.policies.registry import POLICY_NAMES, make_policy
from scheduling.planning.problem import PlanningProblem, PriorityWeights

NOW = pd.Timestamp("2021-07-01T00:00Z")


def toy_problem(
    forecast,
    free,
    gpu,
    dur,
    kw,
    deadline,
    release=None,
    allowed=None,
    transfer=None,
    home=None,
    flex=None,
    limit_w=None,
):
    """A PlanningProblem from plain arrays: forecast/free (H, C); per job gpu (N,), dur/kw (N, K, C) or (N, C),
    deadline (N,) hours from now."""
    forecast = np.asarray(forecast, float)
    H, C = forecast.shape
    dur = np.asarray(dur, float)
    kw = np.asarray(kw, float)
    if dur.ndim == 2:
        dur, kw = dur[:, None, :], kw[:, None, :]
    N, K = dur.shape[0], dur.shape[1]
    gpu = np.asarray(gpu, np.int64)
    jobs = pd.DataFrame(
        {
            "job_id": [f"j{i}" for i in range(N)],
            "submit_time": [NOW] * N,
            "deadline": [NOW + pd.Timedelta(hours=float(d)) for d in deadline],
            "flexibility": flex if flex is not None else [0.3] * N,
            "num_gpu": np.ones(N, np.int64),
            "gpu_milli": gpu,
            "cpu_milli": np.zeros(N, np.int64),
            "memory_mib": np.zeros(N, np.int64),
            "workload_class": ["vision"] * N,
            "checkpointing": [False] * N,
            "gpu_spec": [""] * N,
        }
    )
    return PlanningProblem(
        now=NOW,
        hours=H,
        clusters=[f"c{c}" for c in range(C)],
        regions=[f"r{c}" for c in range(C)],
        zones=[f"Z{c}" for c in range(C)],
        gpu_models=["V100"] * C,
        capacity=np.asarray(free).max(axis=0),
        forecast=forecast,
        free=np.asarray(free, np.int64),
        jobs=jobs,
        release=np.zeros(N, np.int64) if release is None else np.asarray(release, np.int64),
        deadline_rel=np.asarray(deadline, float),
        gpu_total=gpu,
        dur=dur,
        kw=kw,
        limit_w=np.full((K, C), 300.0) if limit_w is None else np.asarray(limit_w, float),
        allowed=np.ones((N, C), bool) if allowed is None else np.asarray(allowed, bool),
        transfer_kwh=np.zeros((N, C)) if transfer is None else np.asarray(transfer, float),
        home=np.zeros(N, np.int64) if home is None else np.asarray(home, np.int64),
        forecast_version="test",
    )


# ------------------------------------------------------------------------------------------------ the optimum
def test_optimum_two_regions_by_hand():
    """Two regions, four hours, one GPU each. Region 0 is 100 g/kWh all day; region 1 is 50 g at hour 0 and
    300 g later. Jobs: 1 kW, 1 h each; job 0 and 1 due by hour 1, job 2 by hour 4.
    Best: one early job in region 1 at hour 0 (0.05 kg), the other early job in region 0 at hour 0 (0.10 kg),
    job 2 in region 0 at hour 1..3 (0.10 kg) -> 0.25 kg."""
    F = [[100, 50], [100, 300], [100, 300], [100, 300]]
    free = [[1000, 1000]] * 4
    p = toy_problem(F, free, gpu=[1000, 1000, 1000], dur=[[1, 1]] * 3, kw=[[1, 1]] * 3, deadline=[1, 1, 4])
    lp = solve_lp(p)
    assert lp.status == "optimal"
    assert lp.objective_kg == pytest.approx(0.25, abs=1e-9)
    # the heuristic reaches it too here
    out = PriorityCarbon(learn_prices=False).plan(p)
    assert out.cost.sum() == pytest.approx(0.25, abs=1e-9)
    assert sorted(out.c[:2].tolist()) == [0, 1] and (out.s[:2] == 0).all()


def test_optimum_fractional_bound_below_integer():
    """One GPU in one region for 2 hours; two 1-GPU jobs of 1 h: each must take one hour. Hour 0: 100 g,
    hour 1: 300 g. Any schedule costs 0.1 + 0.3 = 0.4 kg; the LP gives the same (capacity forces it)."""
    p = toy_problem([[100], [300]], [[1000], [1000]], gpu=[1000, 1000], dur=[[1], [1]], kw=[[1], [1]], deadline=[2, 2])
    assert solve_lp(p).objective_kg == pytest.approx(0.4)
    # a half-GPU job pair shares the cheap hour in the relaxation
    p2 = toy_problem([[100], [300]], [[1000], [1000]], gpu=[500, 500], dur=[[1], [1]], kw=[[1], [1]], deadline=[2, 2])
    assert solve_lp(p2).objective_kg == pytest.approx(0.2)


def test_integral_optimum_closes_the_relaxation_gap():
    """One GPU, hours at 100 and 300 g; two 0.6-GPU jobs of 1 h due by hour 2. Whole jobs: one per hour,
    0.1 + 0.3 = 0.4 kg. The relaxation packs 1/0.6 jobs into the cheap hour: 0.1 x 5/3 + 0.3 x 1/3 = 0.2667 kg."""
    p = toy_problem([[100], [300]], [[1000], [1000]], gpu=[600, 600], dur=[[1], [1]], kw=[[1], [1]], deadline=[2, 2])
    lp = solve_lp(p)
    mip = solve_lp(p, integral=True)
    assert lp.objective_kg == pytest.approx(0.1 * 5 / 3 + 0.3 / 3)
    assert mip.status == "optimal" and mip.objective_kg == pytest.approx(0.4)
    assert set(np.round(mip.x, 9)) <= {0.0, 1.0} and mip.late_job_share == 0


def test_lp_capacity_duals_price_the_clean_hour():
    """One GPU, hours at 100 and 300 g; two 1-GPU 1-kW jobs of 1 h due by hour 2: one runs in each hour. One more
    GPU-milli in hour 0 would move 1/1000 of a job from 300 to 100 g: the hour-0 capacity row's dual (the price the
    learned capacity prices are built from) is 0.2 kg / 1000 milli, and no price is negative."""
    p = toy_problem([[100], [300]], [[1000], [1000]], gpu=[1000, 1000], dur=[[1], [1]], kw=[[1], [1]], deadline=[2, 2])
    lp = solve_lp(p)
    assert lp.status == "optimal" and lp.objective_kg == pytest.approx(0.4)
    assert lp.duals.shape == (1, 2, 1)
    assert lp.duals[0, 0, 0] == pytest.approx(0.2 / 1000)
    assert (lp.duals >= -1e-12).all()


def test_lp_of_an_empty_problem_and_of_jobs_that_fit_nowhere():
    """No jobs: an optimal, empty solution. Jobs too big for every cluster: no candidates, each job late (u = 1) at no
    carbon in the horizon."""
    empty = toy_problem(
        [[100], [300]], [[1000], [1000]], gpu=[], dur=np.zeros((0, 1)), kw=np.zeros((0, 1)), deadline=[]
    )
    lp = solve_lp(empty)
    assert lp.status == "optimal" and lp.objective_kg == 0.0 and lp.n_vars == 0
    big = toy_problem(
        [[100], [300]], [[1000], [1000]], gpu=[2000, 3000], dur=[[1], [1]], kw=[[1], [1]], deadline=[2, 2]
    )
    lp = solve_lp(big)
    assert lp.status == "optimal" and lp.objective_kg == 0.0 and list(lp.u) == [1.0, 1.0] and len(lp.x) == 0


def test_block_capacity_rows_relax_the_lp():
    """`hourly_rows`: after that many hours, one capacity row per block holds the block's mean. One GPU, four
    hours at 100/300/300/50 g; two 1-GPU jobs of 1 h due by hour 4 and one due by hour 1. Hourly rows: the due
    job takes hour 0, the others hours 3 and 1/2 (0.1 + 0.05 + 0.3 = 0.45 kg). With hours 2-3 as one block of
    mean capacity 1 GPU, both flexible jobs fit "into" the block's cheap hour: 0.1 + 2 x 0.05 = 0.2 kg, a
    relaxation (never above the hourly LP); with hourly_rows >= H the model is the hourly one."""
    p = toy_problem(
        [[100], [300], [300], [50]],
        [[1000]] * 4,
        gpu=[1000, 1000, 1000],
        dur=[[1]] * 3,
        kw=[[1]] * 3,
        deadline=[1, 4, 4],
    )
    full = solve_lp(p)
    assert full.objective_kg == pytest.approx(0.45)
    blocked = solve_lp(p, hourly_rows=2, block_h=2)
    assert blocked.objective_kg == pytest.approx(0.2) and blocked.objective_kg <= full.objective_kg + 1e-9
    assert solve_lp(p, hourly_rows=4, block_h=2).objective_kg == pytest.approx(full.objective_kg)
    assert blocked.nnz < full.nnz or blocked.n_rows < full.n_rows


def test_preemptive_bound_runs_a_checkpointed_job_in_the_clean_hours_only():
    """One GPU; hours at 100, 300, 100 g; one 1-kW job of 2 h due by hour 3. Whole run: hours 0-1 or 1-2, 0.4 kg
    either way. Preemptible: hours 0 and 2, 0.2 kg. Not preemptible: the same 0.4 kg as solve_lp."""
    p = toy_problem([[100], [300], [100]], [[1000]] * 3, gpu=[1000], dur=[[2]], kw=[[1]], deadline=[3])
    assert solve_lp(p).objective_kg == pytest.approx(0.4)
    assert solve_preemptive_lp(p, [False]).objective_kg == pytest.approx(0.4)
    bound = solve_preemptive_lp(p, [True])
    assert bound.status == "optimal" and bound.objective_kg == pytest.approx(0.2) and bound.late_job_share == 0
    # at most one hour of work per hour: a 2-h job due by hour 2 cannot squeeze into the cheap hour
    tight = toy_problem([[100], [300]], [[2000]] * 2, gpu=[1000], dur=[[2]], kw=[[1]], deadline=[2])
    assert solve_preemptive_lp(tight, [True]).objective_kg == pytest.approx(0.4)


@pytest.mark.parametrize("seed", range(4))
def test_preemptive_bound_equals_lp_without_preemptible_jobs_and_is_below_it_with(seed):
    """Compared on what both minimise: carbon + 1000 kg per late job (a bound with fewer late jobs may carry more
    carbon, as solve_lp's does)."""
    p = random_problem(np.random.default_rng(seed), N=10, H=14)
    N = p.n_jobs

    def penalised(b):
        return b.objective_kg + 1000.0 * b.late_job_share * N

    lp = penalised(solve_lp(p))
    assert penalised(solve_preemptive_lp(p, np.zeros(N, bool))) == pytest.approx(lp, rel=1e-7)
    some = penalised(solve_preemptive_lp(p, np.arange(N) % 2 == 0))
    assert some <= lp + 1e-6
    assert penalised(solve_preemptive_lp(p, np.ones(N, bool))) <= some + 1e-6


def test_optimum_uses_late_candidates_only_when_needed():
    # two 1-GPU jobs, one GPU, both due at hour 1: one must be late; its cheapest late run is at hour 2 (50 g)
    p = toy_problem(
        [[100], [200], [50]], [[1000]] * 3, gpu=[1000, 1000], dur=[[1], [1]], kw=[[1], [1]], deadline=[1, 1]
    )
    lp = solve_lp(p)
    assert lp.late_job_share == pytest.approx(0.5)
    assert lp.objective_kg == pytest.approx(0.1 + 0.05)
    # with room for both, nothing is late
    p2 = toy_problem(
        [[100], [200], [50]], [[2000]] * 3, gpu=[1000, 1000], dur=[[1], [1]], kw=[[1], [1]], deadline=[1, 1]
    )
    lp2 = solve_lp(p2)
    assert lp2.late_job_share == 0 and lp2.objective_kg == pytest.approx(0.2)


def test_optimum_policy_plan_and_bound_not_above_policies():
    # an instance where the LP runs every job on time and the carbon-aware policy places every job on time too (the
    # bound holds for schedules without late jobs); the baselines run some late here (a late job is cheaper)
    rng = np.random.default_rng(5)
    p = random_problem(rng, N=12, K=2, H=10, C=3)
    opt = OptimumPolicy().plan(p)
    assert opt.stats["lp"]["status"] == "optimal" and opt.stats["lp"]["late_job_share"] == 0
    bound = opt.stats["lp"]["objective_kgco2e"]
    on_time = []
    for name in ("priority", "performance-first", "greedy-carbon", "carbon-time"):
        out = make_policy(name, learn_prices=False).plan(p)
        if out.placed.all() and not out.late.any():
            on_time.append(name)
            assert out.cost.sum() >= bound - 1e-9, name
    assert "priority" in on_time


# ------------------------------------------------------------------------------------------------ priority
def test_priority_parts_by_hand():
    # one cluster, forecast 100..400 over 4 hours; job: 1 h, deadline 4 h, flexibility 0.3
    p = toy_problem(
        [[100], [200], [300], [400]], [[1000]] * 4, gpu=[1000], dur=[[1.0]], kw=[[1.0]], deadline=[4], flex=[0.3]
    )
    w = PriorityWeights()
    parts = priority_parts(p, w)
    assert parts.urgency[0] == pytest.approx(4.0)
    assert parts.flexibility[0] == pytest.approx(0.3)
    assert parts.opportunity[0] == pytest.approx((400 - 100) / 400)
    assert parts.priority[0] == pytest.approx(0.35 * 4 + 0.40 * 0.3 + 0.25 * 0.75)


def test_priority_order_ascending_and_configurable():
    F = [[100, 200]] * 6
    free = [[4000, 4000]] * 6
    # job 0: tight (U = 1), job 1: slack (U = 6), job 2: medium
    p = toy_problem(
        F, free, gpu=[1000] * 3, dur=[[1, 1]] * 3, kw=[[1, 1]] * 3, deadline=[1, 6, 3], flex=[0.2, 0.6, 0.4]
    )
    parts = priority_parts(p, PriorityWeights())
    asc = PriorityCarbon(learn_prices=False).order(p, parts)
    assert asc.tolist() == [0, 2, 1]
    desc = PriorityCarbon(PriorityWeights(order="descending"), learn_prices=False).order(p, parts)
    assert desc.tolist() == [1, 2, 0]
    only_flex = PriorityWeights(urgency=0, flexibility=1, opportunity=0)
    parts2 = priority_parts(p, only_flex)
    assert PriorityCarbon(only_flex, learn_prices=False).order(p, parts2).tolist() == [0, 2, 1]
    with pytest.raises(ValueError):
        PriorityWeights(order="sideways")


def test_tight_job_planned_first_gets_the_scarce_clean_slot():
    """The clean hour 0 in region 0 fits one job. The tight job (due at 1 h) is planned first and takes it
    only if it is cheapest for it; the flexible job waits for region 0's next clean hour."""
    F = [[50, 300], [300, 300], [60, 300]]
    free = [[1000, 1000]] * 3
    p = toy_problem(F, free, gpu=[1000, 1000], dur=[[1, 1]] * 2, kw=[[1, 1]] * 2, deadline=[1, 3])
    out = PriorityCarbon(learn_prices=False).plan(p)
    assert (out.c[0], out.s[0]) == (0, 0)
    assert (out.c[1], out.s[1]) == (0, 2)


def test_range_extrema_matches_numpy():
    rng = np.random.default_rng(0)
    v = rng.random((37, 4))
    lo = rng.integers(0, 37, 50)
    hi = np.minimum(lo + rng.integers(0, 20, 50), 36)
    mx, mn = range_extrema(v, lo, hi)
    for i in range(50):
        np.testing.assert_allclose(mx[i], v[lo[i] : hi[i] + 1].max(axis=0))
        np.testing.assert_allclose(mn[i], v[lo[i] : hi[i] + 1].min(axis=0))


# ------------------------------------------------------------------------------------------------ brute force
def random_problem(rng, N=8, K=2, H=12, C=3, tight=False):
    F = rng.uniform(20, 500, size=(H, C))
    cap = rng.integers(1, 4, size=C) * 1000
    free = np.repeat(cap[None, :], H, axis=0) - rng.integers(0, 2, size=(H, C)) * 500
    gpu = rng.choice([250, 500, 1000, 2000], size=N)
    base = rng.uniform(0.5, 5.0, size=(N, 1, C))
    tf = np.array([1.0, 1.15, 1.3])[:K][None, :, None]
    dur = base * tf
    kw = rng.uniform(0.1, 2.0, size=(N, 1, C)) * np.array([1.0, 0.8, 0.7])[:K][None, :, None]
    deadline = base.max(axis=(1, 2)) * rng.uniform(1.0, 3.0 if not tight else 1.2, size=N)
    release = rng.integers(0, 3, size=N)
    deadline = deadline + release
    allowed = rng.random((N, C)) < 0.85
    allowed[np.arange(N), rng.integers(0, C, N)] = True
    transfer = rng.uniform(0, 2, size=(N, C))
    home = rng.integers(0, C, N)
    transfer[np.arange(N), home] = 0.0
    return toy_problem(
        F,
        free,
        gpu,
        dur,
        kw,
        deadline,
        release,
        allowed,
        transfer,
        home,
        flex=rng.uniform(0.2, 0.6, N),
        limit_w=np.tile([[300.0], [200.0], [150.0]][:K], (1, C)),
    )


def brute_force(p: PlanningProblem, order):
    """Loop over every candidate (k, s, c) with plain Python arithmetic; same rules as the coordinator."""
    free = p.free.astype(np.int64).copy()
    H, C = p.hours, p.n_clusters
    picks = {}
    for j in order:
        best, best_key = None, None
        late_best = None
        for k, s, c in itertools.product(range(p.n_options), range(H), range(C)):
            d = p.dur[j, k, c]
            if not math.isfinite(d) or not p.allowed[j, c] or s < p.release[j]:
                continue
            occ = math.ceil(d - 1e-9)
            if s + occ > H:
                continue
            if any(free[h, c] < p.gpu_total[j] for h in range(s, s + occ)):
                continue
            whole = math.floor(d + 1e-9)
            frac = d - whole if d - whole >= 1e-9 else 0.0
            ci = sum(p.forecast[h, c] for h in range(s, s + whole))
            if frac:
                ci += frac * p.forecast[s + whole, c]
            cost = p.kw[j, k, c] * ci / 1000.0
            if p.transfer_kwh[j, c]:
                cost += p.transfer_kwh[j, c] * 0.5 * (p.forecast[s, p.home[j]] + p.forecast[s, c]) / 1000.0
            timely = s <= math.floor(p.deadline_rel[j] - d + 1e-9)
            if timely:
                key = (round(cost, 12), k, s, c)
                if best_key is None or key < best_key:
                    best_key, best = key, (k, s, c, cost)
            else:
                key = (round(s + d, 9), round(cost, 12), k, s, c)
                if late_best is None or key < late_best[0]:
                    late_best = (key, (k, s, c, cost))
        pick = best if best is not None else (late_best[1] if late_best else None)
        picks[j] = pick
        if pick is not None:
            k, s, c, _ = pick
            free[s : s + math.ceil(p.dur[j, k, c] - 1e-9), c] -= p.gpu_total[j]
    return picks


@pytest.mark.parametrize("seed", range(6))
def test_vectorized_coordinator_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, tight=seed % 2 == 1)
    pol = PriorityCarbon(learn_prices=False)
    out = pol.plan(p, explain=True)
    picks = brute_force(p, out.order)
    for j in range(p.n_jobs):
        pick = picks[j]
        if pick is None:
            assert not out.placed[j]
            continue
        assert out.placed[j]
        k, s, c, cost = pick
        assert (out.k[j], out.s[j], out.c[j]) == (k, s, c), f"job {j}"
        assert out.cost[j] == pytest.approx(cost, rel=1e-9, abs=1e-12)


def brute_candidates(p: PlanningProblem):
    """The LP's candidates by plain loops: every (job, k, s, c) that can run (hosted, released, inside the horizon,
    the job fits the cluster) and is timely, in (job, k, s, c) order with its cost; per job the cheapest run that
    can run but is not timely (first in (k, s, c) order among equal costs)."""
    H, C = p.hours, p.n_clusters
    cands, late = [], {}
    for j in range(p.n_jobs):
        for k, s, c in itertools.product(range(p.n_options), range(H), range(C)):
            d = p.dur[j, k, c]
            if not math.isfinite(d) or not p.allowed[j, c] or s < p.release[j] or p.gpu_total[j] > p.free[:, c].max():
                continue
            if s + math.ceil(d - 1e-9) > H:
                continue
            whole = math.floor(d + 1e-9)
            frac = d - whole if d - whole >= 1e-9 else 0.0
            ci = sum(p.forecast[h, c] for h in range(s, s + whole)) + frac * p.forecast[min(s + whole, H - 1), c]
            cost = p.kw[j, k, c] * ci / 1000.0
            cost += p.transfer_kwh[j, c] * 0.5 * (p.forecast[s, p.home[j]] + p.forecast[s, c]) / 1000.0
            latest = math.floor(p.deadline_rel[j] - d + 1e-9)
            timely = s <= latest and (s == 0 or s <= latest - p.postpone_margin_h)
            if timely:
                cands.append((j, k, s, c, cost))
            elif j not in late or cost < late[j][3] - 1e-12:
                late[j] = (k, s, c, cost)
    return cands, late


@pytest.mark.parametrize("seed", range(4))
def test_lp_candidates_equal_brute_force(seed):
    """`_candidates` batches jobs by the clusters they can use and evaluates only those: the same candidates in
    the same order, the same costs and the same cheapest late runs as a loop over every cell (with a postpone
    margin on odd seeds; some jobs too big for some clusters)."""
    import dataclasses

    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, N=10, H=14, C=4, tight=seed % 2 == 1)
    if seed % 2:
        p = dataclasses.replace(p, postpone_margin_h=2.0)
    job, k, s, c, cost, late_cost, late_pick = _candidates(p)
    ref, late = brute_candidates(p)
    assert [tuple(map(int, t)) for t in zip(job, k, s, c)] == [t[:4] for t in ref]
    np.testing.assert_allclose(cost, [t[4] for t in ref], rtol=1e-9, atol=1e-12)
    for j in range(p.n_jobs):
        if j in late:
            assert late_cost[j] == pytest.approx(late[j][3], rel=1e-9, abs=1e-12)
            kk, ss, cc = late_pick[j]
            assert (kk, ss, cc) == late[j][:3] or cost_close(p, j, (kk, ss, cc), late[j][3])
        else:
            assert np.isnan(late_cost[j]) and (late_pick[j] == -1).all()


def cost_close(p, j, pick, cost):
    """A tie: the pick the batch took costs the same (to rounding) as the loop's."""
    ev = Evaluator(p)
    return ev.view(j, None).cost[pick] == pytest.approx(cost, rel=1e-9)


def test_batched_views_and_start_now_equal_one_job_views():
    """`Evaluator.views` over jobs with different start-hour ranges gives each job the arrays of its own view; and
    `start_now` (the dispatch's hour-0 table) gives view(j, free, 1)'s column at hour 0."""
    rng = np.random.default_rng(7)
    p = random_problem(rng, N=9, H=12, C=3)
    ev = Evaluator(p)
    free = p.free.astype(np.int64) - rng.integers(0, 2, size=p.free.shape) * 250
    J = np.arange(p.n_jobs)
    ns = rng.integers(1, p.hours + 1, size=len(J))
    batch = [v for b in ev.each_batch(J, free, ns) for v in ev.views_of(b)]
    for j, v in zip(J, batch):
        one = Evaluator(p).view(int(j), free, int(ns[j]))
        assert v.j == j and v.n == ns[j]
        for name in ("cost", "carbon", "end", "base_ok", "cap_ok", "timely", "feasible", "occ", "s"):
            np.testing.assert_array_equal(getattr(v, name), getattr(one, name), err_msg=name)
        for c in range(p.n_clusters):
            cost_now, ok_now = ev.start_now(int(j), c, free)
            np.testing.assert_array_equal(cost_now, one.cost[:, 0, c])
            np.testing.assert_array_equal(ok_now, one.feasible[:, 0, c])
    # the batched explanations (rolling-lp's) equal one-job explanations (the coordinator's), each on its own range
    prio = priority_parts(p, PriorityWeights())
    kk = rng.integers(0, p.n_options, len(J))
    ss = np.array([rng.integers(0, n) for n in ns])
    cc = rng.integers(0, p.n_clusters, len(J))
    late = rng.random(len(J)) < 0.2
    rejected = rng.random((len(J), p.n_clusters)) < 0.2
    opt = rng.uniform(0, 1, len(J))
    records = []
    for b in ev.each_batch(J, free, ns):
        i = b.J
        records += explain_batch(
            p, "rolling-lp", b, b.cost, kk[i], ss[i], cc[i], late[i], rejected[i], prio, ev, opt[i]
        )
    for j, v in zip(J, batch):
        one = explain_choice(
            p,
            "rolling-lp",
            int(j),
            v,
            v.cost,
            int(kk[j]),
            int(ss[j]),
            int(cc[j]),
            bool(late[j]),
            rejected[j],
            prio,
            ev,
            optimum_kg=float(opt[j]),
        )
        assert records[j] == one
        assert set(EXPLANATION_KEYS) <= set(one)


# ------------------------------------------------------------------------------------------------ invariants
def _check_invariants(p: PlanningProblem, out):
    used = np.zeros_like(p.free)
    for j in np.flatnonzero(out.placed):
        k, s, c = out.k[j], out.s[j], out.c[j]
        d = p.dur[j, k, c]
        assert p.allowed[j, c]
        assert s >= p.release[j]
        occ = math.ceil(d - 1e-9)
        assert s + occ <= p.hours
        used[s : s + occ, c] += p.gpu_total[j]
        if not out.late[j]:
            assert s + d <= p.deadline_rel[j] + 1e-6, "deadline violated"
    assert (used <= p.free).all(), "capacity exceeded"


@pytest.mark.parametrize(
    "name", ["priority", "performance-first", "greedy-carbon", "carbon-time", "round-robin", "random"]
)
@pytest.mark.parametrize("seed", range(4))
def test_deadline_and_capacity_invariants(name, seed):
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, N=15, K=2, H=14, C=3, tight=seed % 2 == 0)
    out = make_policy(name, seed=seed, learn_prices=False).plan(p)
    _check_invariants(p, out)
    _check_lateness(name, p, out)


def _check_lateness(name: str, p: PlanningProblem, out) -> None:
    """A job is late (or unplaced) only when no timely (or no) candidate existed when it was planned. The jobs are
    planned one by one and capacity only shrinks, so the GPUs that every other job leaves free at the end are at
    most those free when the job was planned: a candidate that fits them would have fitted then."""
    for j in np.flatnonzero(out.late | ~out.placed):
        fits = _candidates_left(p, out, int(j), timely_only=bool(out.placed[j]))
        assert not fits, f"{name}: job {j} {'late' if out.placed[j] else 'unplaced'} though (k, s, c) {fits[0]} fits"


def _candidates_left(p: PlanningProblem, out, j: int, timely_only: bool) -> list[tuple[int, int, int]]:
    """The (k, s, c) of job j inside the horizon that fit the GPUs left free by every other placed job (and meet
    the deadline when `timely_only`), by plain loops."""
    free = p.free.astype(np.int64).copy()
    for i in np.flatnonzero(out.placed):
        if i != j:
            occ = math.ceil(p.dur[i, out.k[i], out.c[i]] - 1e-9)
            free[out.s[i] : out.s[i] + occ, out.c[i]] -= p.gpu_total[i]
    fits = []
    for k, s, c in itertools.product(range(p.n_options), range(p.hours), range(p.n_clusters)):
        d = p.dur[j, k, c]
        if not math.isfinite(d) or not p.allowed[j, c] or s < p.release[j]:
            continue
        occ = math.ceil(d - 1e-9)
        if s + occ > p.hours or (timely_only and s + d > p.deadline_rel[j] + 1e-9):
            continue
        if all(free[h, c] >= p.gpu_total[j] for h in range(s, s + occ)):
            fits.append((k, s, c))
    return fits


@pytest.mark.parametrize(
    "name", ["priority", "performance-first", "greedy-carbon", "carbon-time", "round-robin", "random"]
)
def test_a_job_is_late_only_when_no_timely_candidate_is_left(name):
    """Three 1-GPU jobs due in 2 h on two clusters of one GPU each: one of them must be late, and is."""
    p = toy_problem(
        [[100, 200], [300, 50], [80, 90], [60, 70]],
        [[1000, 1000]] * 4,
        gpu=[1000] * 3,
        dur=[[2, 2]] * 3,
        kw=[[1, 1]] * 3,
        deadline=[2, 2, 2],
    )
    out = make_policy(name, seed=0, learn_prices=False).plan(p)
    assert out.placed.all() and out.late.sum() == 1
    _check_lateness(name, p, out)


def test_deadline_never_violated_when_capacity_allows():
    rng = np.random.default_rng(7)
    p = random_problem(rng, N=10, K=2, H=16, C=3)
    p.free[:] = 10**6  # ample capacity
    for name in ("priority", "performance-first", "greedy-carbon", "carbon-time", "round-robin", "random"):
        out = make_policy(name, learn_prices=False).plan(p)
        assert out.placed.all() and not out.late.any(), name
        _check_invariants(p, out)


def test_power_option_chosen_only_when_it_lowers_carbon_within_deadline():
    # option 1 (capped): 20 % slower, 30 % less power -> lower energy; deadline allows it for job 0 only
    F = [[100]] * 6
    dur = np.array([[[2.0], [2.4]], [[2.0], [2.4]]])
    kw = np.array([[[1.0], [0.7]], [[1.0], [0.7]]])
    p = toy_problem(F, [[4000]] * 6, gpu=[1000, 1000], dur=dur, kw=kw, deadline=[3, 2.2])
    out = PriorityCarbon(learn_prices=False).plan(p)
    assert out.k[0] == 1 and out.cost[0] == pytest.approx(0.7 * 2.4 * 100 / 1000)
    assert out.k[1] == 0
    base = PerformanceFirst().plan(
        toy_problem(F, [[4000]] * 6, gpu=[1000], dur=dur[:1, :1], kw=kw[:1, :1], deadline=[3])
    )
    assert base.k[0] == 0


def test_baseline_scores():
    # region 1 is cleaner now, region 0 cleaner later; greedy takes region 1 now; performance-first the faster
    F = [[300, 100], [50, 400], [50, 400]]
    free = [[1000, 1000]] * 3
    dur = [[1.0, 1.5]]
    p = toy_problem(F, free, gpu=[1000], dur=dur, kw=[[1, 1]], deadline=[3])
    assert (GreedyCarbon().plan(p).c[0], GreedyCarbon().plan(p).s[0]) == (1, 0)
    pf = PerformanceFirst().plan(p)
    assert (pf.c[0], pf.s[0]) == (0, 0)
    ct = CarbonTime().plan(p)
    # the best earliest start costs 0.1 + 0.2 = 0.15 kg (region 1); waiting one hour in region 0 costs 0.05 kg
    assert (ct.c[0], ct.s[0]) == (0, 1)
    assert PriorityCarbon(learn_prices=False).plan(p).cost[0] == pytest.approx(0.05)


def test_policy_registry():
    assert set(POLICY_NAMES) >= {
        "priority",
        "performance-first",
        "greedy-carbon",
        "carbon-time",
        "round-robin",
        "random",
        "optimum",
    }
    for name in POLICY_NAMES:
        assert isinstance(make_policy(name), PlacementPolicy)
    with pytest.raises(KeyError):
        make_policy("nope")


# ------------------------------------------------------------------------------------------------ agents
def test_agent_rejects_fragmented_cluster_and_job_goes_to_next_best():
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    # cluster 0 (clean): two nodes with one GPU each, both half used: 1000 milli free in total, no device fits
    c0 = Cluster(["n0", "n1"], [64000, 64000], [262144, 262144], [1, 1], ["V100", "V100"])
    c1 = Cluster(["m0"], [64000], [262144], [1], ["V100"])
    a0, a1 = ClusterAgent("c0", c0, policy="bestfit"), ClusterAgent("c1", c1, policy="bestfit")
    for i, node in enumerate((0, 1)):
        pod = Pod(f"old{i}", 1000, 1024, 1, 500)
        c0.allocate(pod, node, (0,))
        a0.end_hour[pod.pod_id] = 10**9
    F = [[50, 300], [50, 300]]
    p = toy_problem(F, [[1000, 1000], [1000, 1000]], gpu=[1000], dur=[[1, 1]], kw=[[1, 1]], deadline=[1])
    pods = [Pod("j0", 1000, 1024, 1, 1000)]
    out = Coordinator(p, PriorityCarbon(learn_prices=False), [a0, a1], pods, now_hour=0).run()
    assert out.c[0] == 1 and out.s[0] == 0
    assert out.rejections[0] == 1
    assert out.node[0] == "m0" and out.status[0] == "dispatched"
    assert "capacity" in out.explanations[0]["binding_constraints"]
    assert out.explanations[0]["agent_rejections"] == ["c0"]


def test_tentative_nodes_for_future_starts():
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    c0 = Cluster(["n0"], [64000], [262144], [2], ["V100"])
    agent = ClusterAgent("c0", c0, policy="bestfit")
    F = [[300], [50], [50], [300]]
    p = toy_problem(F, [[2000]] * 4, gpu=[1000, 1000], dur=[[1], [1]], kw=[[1], [1]], deadline=[4, 4])
    pods = [Pod("j0", 1000, 1024, 1, 1000), Pod("j1", 1000, 1024, 1, 1000)]
    out = Coordinator(p, PriorityCarbon(learn_prices=False), [agent], pods, now_hour=0).run()
    assert (out.s > 0).all() and all(st == "tentative" for st in out.status)
    assert all(n == "n0" for n in out.node)
    assert len(c0.bindings) == 0  # the live cluster is untouched


def test_reservation_drains_the_node_that_frees_first_and_allows_backfill():
    """An 8-GPU job cannot start while 1-GPU jobs sit on both 8-GPU nodes. Reserving holds the node whose jobs
    end first (n1, at hour 5): a job that would run past hour 5 may not go there, one that ends by then may
    (backfill); once n1 drains, the 8-GPU job gets it and the reservation is gone."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    cl = Cluster(["n0", "n1"], [96000, 96000], [262144, 262144], [8, 8], ["V100", "V100"])
    agent = ClusterAgent("c0", cl, policy="bestfit")
    for i, (node, end) in enumerate([(0, 10), (0, 10), (1, 5)]):
        pod = Pod(f"old{i}", 1000, 1024, 1, 1000)
        cl.allocate(pod, node, (i % 2,) if node == 0 else (0,))
        agent.end_hour[pod.pod_id] = end
    big = Pod("big", 8000, 8192, 8, 1000)
    assert agent.offer(big, 20) is None
    assert agent.reserve(big) == "n1" and agent.reserved == {1: ("big", 5)}
    assert agent.reserve(Pod("other", 8000, 8192, 8, 1000)) is None  # one held node per cluster
    long_pod = agent.offer(Pod("long", 1000, 1024, 1, 1000), 9)
    assert long_pod is not None and long_pod.node_name == "n0"
    for i in range(5):  # fill n0: the next long job finds no node
        assert agent.offer(Pod(f"fill{i}", 1000, 1024, 1, 1000), 9).node_name == "n0"
    assert agent.offer(Pod("long2", 1000, 1024, 1, 1000), 9) is None
    short = agent.offer(Pod("short", 1000, 1024, 1, 1000), 5)
    assert short is not None and short.node_name == "n1"
    agent.release_finished(5)
    placed = agent.offer(big, 25)
    assert placed is not None and placed.node_name == "n1" and agent.reserved == {}


def test_hourly_planner_reserves_only_for_blocked_due_multi_gpu_jobs():
    from scheduling.domain.fleet import load_fleet
    from scheduling.domain.jobs import generate_jobs
    from scheduling.packing import Pod
    from scheduling.planning.problem import abs_hours
    from scheduling.planning.session import HourlyPlanner

    t = pd.Timestamp("2021-07-05T00:00Z")
    now_h = abs_hours(t)
    fleet = load_fleet(regions=2)
    jobs = generate_jobs(40, t, 1, fleet, seed=3, arrival="all-at-start", max_duration_h=24.0)
    hp = HourlyPlanner(fleet, jobs, "performance-first", forecasts=None, explain=False, reserve_nodes=True)
    hp.reserve_lead_h = 1e6  # every job counts as due
    idx = np.arange(len(jobs))
    assert hp.reserve_nodes_for(idx, now_h) == {}  # an empty fleet: every job fits somewhere now
    n = 0  # occupy every device of every node with 1-GPU jobs: multi-GPU jobs are then blocked everywhere
    for agent in hp.agents:
        cl = agent.cluster
        for node in range(cl.n_nodes):
            for g in range(int(cl.gpu_count[node])):
                pod = Pod(f"filler{n}", 0, 0, 1, 1000)
                cl.allocate(pod, node, (g,))
                agent.end_hour[pod.pod_id] = now_h + 100 + n
                n += 1
    held = hp.reserve_nodes_for(idx, now_h)
    multi = set(jobs.loc[jobs["num_gpu"] > 1, "job_id"].astype(str))
    assert held and set(held) <= multi
    assert sum(len(a.reserved) for a in hp.agents) == len(held) <= len(hp.agents)
    held_cap = hp.held_capacity(now_h, 200)
    assert (held_cap[0] == 0).all()  # the held nodes are full: nothing more is held back now
    hp.reserve_lead_h = 0.0  # only jobs that cannot wait another hour
    latest = hp.table.deadline_h - np.nanmin(np.where(hp.table.allowed, hp.table.dur[:, 0], np.inf), axis=1)
    due = {str(j) for j in jobs["job_id"][(latest < now_h + 1) & (jobs["num_gpu"] > 1).to_numpy()]}
    assert set(hp.reserve_nodes_for(idx, now_h)) <= due


# ------------------------------------------------------------------------------------------------ contract
def test_plan_contract_fields():
    rng = np.random.default_rng(11)
    p = random_problem(rng, N=6, K=2, H=10, C=3)
    plan = PriorityCarbon(learn_prices=False).plan(p).to_plan()
    assert isinstance(plan, Plan)
    assert plan.plan_time == NOW and plan.policy == "priority" and plan.forecast_version == "test"
    for col in ASSIGNMENT_COLUMNS:
        assert col in plan.assignments.columns
    assert len(plan.assignments) + len(plan.unplaced) == p.n_jobs
    assert list(plan.unplaced.columns) == ["job_id", "reason"]
    assert len(plan.explanations) == len(plan.assignments)
    for e in plan.explanations:
        for key in EXPLANATION_KEYS:
            assert key in e
        assert set(e["chosen"]) >= {"region", "cluster", "start_time", "kgco2e"}
        assert len(e["alternatives"]) <= 5
        for alt in e["alternatives"]:
            assert set(alt) >= {"region", "start_time", "kgco2e"}
            assert alt["kgco2e"] >= e["chosen"]["kgco2e"] - 1e-9  # the chosen one is the cheapest
        assert set(e["counterfactuals"]) == {"run_now_kgco2e", "greedy_carbon_kgco2e", "optimum_kgco2e"}
        assert set(e["binding_constraints"]) <= set(BINDING_CONSTRAINTS)
        assert set(e["power"]) == {"limit_w", "saving_kgco2e"}
        assert set(e["weights"]) >= {"urgency", "flexibility", "opportunity"}
    a = plan.assignments
    assert (a["end_time"] > a["start_time"]).all()
    assert a["expected_kgco2e"].notna().all() and (a["expected_energy_kwh"] > 0).all()
    s = plan.summary()
    assert s["n_jobs"] == p.n_jobs
    d = plan.to_dict()
    import json

    json.dumps(d)


def test_plan_store_accepts_plan(tmp_warehouse):
    rng = np.random.default_rng(12)
    p = random_problem(rng, N=5, K=2, H=10, C=3)
    plan = PriorityCarbon(learn_prices=False).plan(p).to_plan()
    plan_store.write_plan(plan, created_from="test")
    back = plan_store.read_plan(plan_store.plan_id_for("priority", NOW))
    assert len(back.assignments) == len(plan.assignments)


def test_hold_until_the_planned_start_serves_jobs_that_end_before_it():
    """A hold made for a job planned at hour 12 on a node that drains at hour 5: jobs ending by hour 12 may use
    the node in between, one ending later may not; asking again returns the same node with its real drain hour."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    cl = Cluster(["n0", "n1"], [96000, 96000], [262144, 262144], [8, 8], ["V100", "V100"])
    agent = ClusterAgent("c0", cl, policy="bestfit")
    for i, (node, end) in enumerate([(0, 10), (1, 5)]):
        pod = Pod(f"old{i}", 1000, 1024, 1, 1000)
        cl.allocate(pod, node, (0,))
        agent.end_hour[pod.pod_id] = end
    big = Pod("big", 8000, 8192, 8, 1000)
    assert agent.reserve(big, until_h=12) == "n1" and agent.reserved == {1: ("big", 12)}
    assert agent.drain_option(big) == (1, 5)
    for i in range(7):  # n0 full
        assert agent.offer(Pod(f"fill{i}", 1000, 1024, 1, 1000), 9).node_name == "n0"
    assert agent.offer(Pod("late", 1000, 1024, 1, 1000), 13) is None
    assert agent.offer(Pod("early", 1000, 1024, 1, 1000), 12).node_name == "n1"


def test_rolling_lp_holds_a_node_for_a_blocked_multi_gpu_job_and_plans_it_after_the_drain():
    """Cluster 0 (clean) has two 8-GPU nodes, each running a 1-GPU job (until hours 4 and 8): 14 GPUs free, but no
    node for an 8-GPU job. Plain rolling-lp plans the job there now and the agent rejects it. With holds, the LP
    learns that it cannot start on cluster 0 before hour 4 (when n0 drains), plans it there then, and n0 is held:
    a 1-GPU job that would run past hour 4 is kept off it."""
    from scheduling.evaluation.ablations import ReserveMultiGpu
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions

    def fresh_agents():
        agents = [
            ClusterAgent(
                "c0", Cluster(["n0", "n1"], [96000] * 2, [262144] * 2, [8, 8], ["V100"] * 2), policy="bestfit"
            ),
            ClusterAgent("c1", Cluster(["m0"], [96000], [262144], [8], ["V100"]), policy="bestfit"),
        ]
        for node, end in ((0, 4), (1, 8)):
            pod = Pod(f"old{node}", 1000, 1024, 1, 1000)
            agents[0].cluster.allocate(pod, node, (0,))
            agents[0].end_hour[pod.pod_id] = end
        return agents

    H = 12
    free = [[14000, 8000]] * 4 + [[15000, 8000]] * 4 + [[16000, 8000]] * (H - 8)
    p = toy_problem(
        forecast=[[10 + h, 500] for h in range(H)],
        free=free,
        gpu=[8000, 1000],
        dur=[[3, 3], [6, 6]],
        kw=[[2, 2], [0.3, 0.3]],
        deadline=[12, 12],
    )
    p.jobs["num_gpu"] = [8, 1]
    p.jobs["gpu_milli"] = [1000, 1000]
    pods = [Pod("j0", 8000, 8192, 8, 1000), Pod("j1", 1000, 1024, 1, 1000)]
    plain = RollingLP(RollingLPOptions(capacity_factor=1.0)).plan(p, fresh_agents(), pods, 0, explain=False)
    assert not plain.placed[0] and plain.reason[0] == "rejected_by_agents"  # the LP's aggregate view: now, on c0
    agents = fresh_agents()
    held = ReserveMultiGpu(options=RollingLPOptions(capacity_factor=1.0)).plan(p, agents, pods, 0, explain=False)
    assert held.placed[0] and held.status[0] == "tentative" and (held.s[0], held.c[0]) == (4, 0)
    assert agents[0].reserved == {0: ("j0", 4)}
    # the 6-hour 1-GPU job starts now on the clean cluster, but not on the held node
    assert held.placed[1] and (held.s[1], held.c[1]) == (0, 0) and held.node[1] == "n1"
    # a busy fleet (allocation above the guard) drops the holds and plans as without them
    agents = fresh_agents()
    guarded = ReserveMultiGpu(below_utilization=0.05, options=RollingLPOptions(capacity_factor=1.0))
    out = guarded.plan(p, agents, pods, 0, explain=False)
    assert not out.placed[0] and agents[0].reserved == {}


def test_standby_node_is_kept_for_multi_gpu_jobs():
    """keep_standby picks the largest node that drains first and keeps it: a 1-GPU job may not use it (unless it
    ends by the backfill hour), an 8-GPU job may; node_usage counts what runs on it until its end hour."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import STANDBY, ClusterAgent

    cl = Cluster(["n0", "n1", "n2", "s"], [96000] * 3 + [8000], [262144] * 3 + [8192], [8, 8, 8, 1], ["V100"] * 4)
    agent = ClusterAgent("c0", cl, policy="bestfit")
    for node, end in ((0, 9), (1, 3)):
        pod = Pod(f"old{node}", 1000, 1024, 1, 500)
        cl.allocate(pod, node, (0,))
        agent.end_hour[pod.pod_id] = end
    assert agent.keep_standby(1, until_h=0) == [2]  # the empty 8-GPU node
    assert agent.keep_standby(1, until_h=0) == [2] and agent.reserved == {2: (STANDBY, 0)}
    assert agent.node_usage([1], now_h=0, hours=5).tolist() == [500, 500, 500, 0, 0]
    small = agent.offer(Pod("small", 1000, 1024, 1, 1000), 5)
    assert small is not None and small.node_name != "n2"
    big = agent.offer(Pod("big", 64000, 200000, 8, 1000), 40)
    assert big is not None and big.node_name == "n2"


def test_free_breakdown_tells_whole_devices_fragments_and_standby_apart():
    """Free GPU-milli split three ways: whole free devices, shares left on partly used devices (fragments only a
    small job can use), and the standby node's devices; the parts add up to the free GPU-milli."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    cl = Cluster(["n0", "n1", "n2"], [96000, 96000, 96000], [262144] * 3, [4, 2, 8], ["V100"] * 3)
    agent = ClusterAgent("c0", cl, policy="bestfit")
    assert agent.free_breakdown() == (14000, 0, 0)
    cl.allocate(Pod("a", 1000, 1024, 1, 650), 0, (0,))
    cl.allocate(Pod("b", 1000, 1024, 1, 300), 0, (1,))
    cl.allocate(Pod("c", 1000, 1024, 2, 1000), 1, (0, 1))
    agent.keep_standby(1, until_h=0)  # n2, the only 8-GPU node
    whole, fragments, standby = agent.free_breakdown()
    assert (whole, fragments, standby) == (2000, 350 + 700, 8000)
    assert whole + fragments + standby == cl.gpu_milli_capacity - cl.gpu_milli_allocated
    cl.allocate(Pod("d", 1000, 1024, 1, 200), 2, (5,))  # a share used on the standby node stays standby's
    assert agent.free_breakdown() == (2000, 1050, 7800)


def test_standby_is_the_node_that_hosts_whole_node_jobs_and_is_kept_for_them():
    """Of three 8-GPU nodes only n2 has the 82 cores an 8-GPU job asks for: it is the standby, whatever drains first.
    It is kept for whole-node jobs (8 GPUs): a 2-GPU job goes elsewhere unless the threshold is 2; and the LP's
    standby part is open only to the jobs one of its nodes can hold (the 88-core job: none)."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP

    def cluster():
        return Cluster(["n0", "n1", "n2"], [64000, 64000, 82000], [262144, 262144, 344064], [8, 8, 8], ["V100"] * 3)

    agent = ClusterAgent("c0", cluster(), policy="bestfit")
    old = Pod("old", 1000, 1024, 1, 1000)
    agent.cluster.allocate(old, 2, (0,))
    agent.end_hour[old.pod_id] = 30  # n2 drains last, and is still the one that can hold the big jobs
    assert agent.keep_standby(1, until_h=0, job_gpus=8) == [2]
    pair = agent.offer(Pod("pair", 2000, 2048, 2, 1000), 5)
    assert pair is not None and pair.node_name != "n2"
    loose = ClusterAgent("c0", cluster(), policy="bestfit")
    loose.keep_standby(1, until_h=0, job_gpus=2)
    for n in (0, 1):  # fill the other nodes: the 2-GPU job may take the standby node when the threshold is 2
        loose.cluster.allocate(Pod(f"fill{n}", 1000, 1024, 8, 1000), n, tuple(range(8)))
    assert loose.offer(Pod("pair", 2000, 2048, 2, 1000), 5).node_name == "n2"

    p = toy_problem(
        forecast=[[10, 500]] * 6,
        free=[[24000, 8000]] * 6,
        gpu=[8000, 8000, 2000],
        dur=[[3, 3]] * 3,
        kw=[[2, 2]] * 3,
        deadline=[6] * 3,
    )
    p.jobs["num_gpu"] = [8, 8, 2]
    p.jobs["gpu_milli"] = 1000
    p.jobs["cpu_milli"] = [64200, 88000, 2000]
    p.jobs["memory_mib"] = [263168, 327680, 2048]
    agents = [
        ClusterAgent("c0", cluster(), policy="bestfit"),
        ClusterAgent("c1", Cluster(["m0"], [96000], [786432], [8], ["V100"]), policy="bestfit"),
    ]
    split, _ = RollingLP()._standby_split(p, agents, 0)
    assert split.clusters[-1] == "c0/standby"
    assert split.allowed[:, -1].tolist() == [True, False, False]  # 88 cores fit no standby node; 2 GPUs: not whole-node


def test_standby_pool_keeps_one_node_per_cluster_by_default():
    """Six 8-GPU nodes: one in three would be two standby nodes, a third of the cluster idle for the rare whole-node
    jobs (a 270-GPU fleet at load 0.8 then met 84 % of deadlines); `standby_max_nodes` (default 1) keeps one."""
    from scheduling.evaluation.ablations import StandbyBelowUtilization
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions

    def agents():
        names = [f"n{i}" for i in range(6)]
        return [ClusterAgent("c0", Cluster(names, [96000] * 6, [262144] * 6, [8] * 6, ["V100"] * 6), policy="bestfit")]

    p = toy_problem(
        forecast=[[10]] * 4, free=[[48000]] * 4, gpu=[8000, 1000], dur=[[2], [2]], kw=[[2], [0.3]], deadline=[4, 4]
    )
    p.jobs["num_gpu"] = [8, 1]
    p.jobs["gpu_milli"] = 1000
    for limit, kept in ((1, 1), (None, 2)):
        a = agents()
        split, real = RollingLP(RollingLPOptions(standby_max_nodes=limit))._standby_split(p, a, 0)
        assert real.tolist() == [0, 0] and len(a[0].standby_nodes()) == kept
        assert split.free[0].tolist() == [48000 - 8000 * kept, 8000 * kept]
    # opt-in guard: above that share of the fleet's GPUs allocated the standby is given back (a busy fleet)
    a = agents()
    policy = StandbyBelowUtilization(0.5)
    assert policy._standby_split(p, a, 0) is not None and len(a[0].standby_nodes()) == 1
    for n in range(3):
        a[0].cluster.allocate(Pod(f"busy{n}", 1000, 1024, 8, 1000), n, tuple(range(8)))
    p.free[:] = 48000 - a[0].gpu_milli_allocated  # the problem's free capacity describes the running jobs
    assert policy._standby_split(p, a, 1) is not None  # exactly half allocated: kept
    a[0].cluster.allocate(Pod("busy3", 1000, 1024, 1, 1000), 3, (0,))
    p.free[:] = 48000 - a[0].gpu_milli_allocated
    assert policy._standby_split(p, a, 2) is None and a[0].standby_nodes() == []


def test_rolling_lp_standby_pool_plans_multi_gpu_jobs_on_the_standby_node_only():
    """A clean cluster of three 8-GPU nodes (one 1-GPU job on each of two of them) and a dirty one. With the
    standby pool the LP sees the clean cluster's empty node as open to the 8-GPU job only: the job starts there now,
    and the 1-GPU jobs are planned on the other two nodes' capacity (14 GPUs), never on the standby node."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions

    agents = [
        ClusterAgent(
            "c0", Cluster(["n0", "n1", "n2"], [96000] * 3, [262144] * 3, [8] * 3, ["V100"] * 3), policy="bestfit"
        ),
        ClusterAgent("c1", Cluster(["m0"], [96000], [262144], [8], ["V100"]), policy="bestfit"),
    ]
    for node in (0, 1):
        pod = Pod(f"old{node}", 1000, 1024, 1, 1000)
        agents[0].cluster.allocate(pod, node, (0,))
        agents[0].end_hour[pod.pod_id] = 6
    H = 10
    n_small = 10
    p = toy_problem(
        forecast=[[10 + h, 500] for h in range(H)],
        free=[[22000, 8000]] * 6 + [[24000, 8000]] * (H - 6),
        gpu=[8000] + [1000] * n_small,
        dur=[[3, 3]] + [[2, 2]] * n_small,
        kw=[[2, 2]] + [[0.3, 0.3]] * n_small,
        deadline=[10] + [10] * n_small,
    )
    p.jobs["num_gpu"] = [8] + [1] * n_small
    p.jobs["gpu_milli"] = 1000
    pods = [Pod("j0", 64000, 200000, 8, 1000)] + [Pod(f"s{i}", 1000, 1024, 1, 1000) for i in range(n_small)]
    policy = RollingLP(RollingLPOptions(capacity_factor=1.0))
    split, real = policy._standby_split(p, agents, 0)
    assert split.clusters == ["c0", "c1", "c0/standby"] and real.tolist() == [0, 1, 0]
    assert split.free[0].tolist() == [14000, 8000, 8000] and split.free[-1].tolist() == [16000, 8000, 8000]
    assert split.allowed[0].tolist() == [False, True, True] and split.allowed[1].tolist() == [True, True, False]
    assert RollingLP(RollingLPOptions(standby_pool=False))._standby_split(p, agents, 0) is None
    out = policy.plan(p, agents, pods, 0, explain=True)
    assert out.placed[0] and (out.s[0], out.c[0]) == (0, 0) and out.node[0] == "n2"
    small_now = [j for j in range(1, n_small + 1) if out.placed[j] and out.s[j] == 0 and out.c[j] == 0]
    assert small_now and all(out.node[j] in ("n0", "n1") for j in small_now)
    assert out.explanations and all(e["chosen"]["cluster"] in ("c0", "c1") for e in out.explanations)


def test_evict_for_frees_a_node_with_the_cheapest_victims_and_changes_nothing_when_it_cannot():
    """n0 holds three evictable 1-GPU jobs (costs 5, 1, 3); n1 a job that may not be evicted. A 6-GPU job needs one
    of n0's jobs gone: the cheapest (b); the others stay bound. A 9-GPU job fits no node: nothing changes."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent

    agent = ClusterAgent("c0", Cluster(["n0", "n1"], [96000] * 2, [262144] * 2, [8, 8], ["V100"] * 2), policy="bestfit")
    for name, node, dev, gpus in (("a", 0, 0, 1), ("b", 0, 1, 1), ("c", 0, 2, 1), ("keep", 1, 0, 3)):
        agent.cluster.allocate(Pod(name, 1000, 1024, gpus, 1000), node, tuple(range(dev, dev + gpus)))
        agent.end_hour[name] = 9
    evictable = {"a": 5.0, "b": 1.0, "c": 3.0}
    before = dict(agent.cluster.bindings)
    assert agent.evict_for(Pod("huge", 1000, 1024, 9, 1000), 4, evictable) is None
    assert agent.cluster.bindings == before
    placement, victims = agent.evict_for(Pod("big", 1000, 1024, 6, 1000), 4, evictable)
    assert victims == ["b"] and placement.node_name == "n0"
    assert set(agent.cluster.bindings) == {"a", "c", "keep", "big"} and "b" not in agent.end_hour
    assert agent.end_hour["big"] == 4 and agent.cluster.gpu_milli_allocated == 11000


def test_rolling_lp_preempts_checkpointing_jobs_for_a_due_job_only_when_offered():
    """One 8-GPU node runs two 4-GPU jobs until hour 10; an 8-GPU job must start now to meet its deadline. With no
    running job offered (`problem.evictable`, the planner's preemption off) it cannot start (and runs late later);
    with both offered, they are evicted and it starts now on that node. A running job not offered blocks it."""
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions

    def agents():
        ag = ClusterAgent("c0", Cluster(["n0"], [96000], [262144], [8], ["V100"]), policy="bestfit")
        for name, dev in (("r1", 0), ("r2", 4)):
            ag.cluster.allocate(Pod(name, 1000, 1024, 4, 1000), 0, tuple(range(dev, dev + 4)))
            ag.end_hour[name] = 10
        return [ag]

    def problem(evictable):
        p = toy_problem(
            forecast=[[100]] * 12, free=[[0]] * 10 + [[8000]] * 2, gpu=[8000], dur=[[3]], kw=[[2]], deadline=[3]
        )
        p.jobs["num_gpu"], p.jobs["gpu_milli"] = 8, 1000
        p.evictable = evictable
        return p

    pods = [Pod("j0", 1000, 1024, 8, 1000)]
    options = RollingLPOptions(capacity_factor=1.0, standby_pool=False, expected_arrivals_h=0)
    plain = RollingLP(options)
    out = plain.plan(problem(None), agents(), pods, 0, explain=False)
    assert not (out.placed[0] and out.s[0] == 0) and out.evicted == []
    pre = RollingLP(options)
    ag = agents()
    out = pre.plan(problem({"r1": 1.0, "r2": 2.0}), ag, pods, 0, explain=False)
    assert out.placed[0] and out.s[0] == 0 and not out.late[0] and out.node[0] == "n0"
    assert sorted(v for v, _, _ in out.evicted) == ["r1", "r2"] and set(ag[0].cluster.bindings) == {"j0"}
    out = pre.plan(problem({"r1": 1.0}), agents(), pods, 0, explain=False)
    assert not (out.placed[0] and out.s[0] == 0) and out.evicted == []


def test_standby_yields_to_a_job_due_now_only_when_asked():
    """Two of three 8-GPU nodes busy for 5 h, the third on standby for whole-node jobs. A 1-GPU job due now (its
    deadline is its run time) fits only the standby node: without the yield (`StandbyNeverYields`) it is refused
    there and runs late; by default it starts now on the standby node (a deadline outranks an idle node). A job that
    is not due yet still never gets the standby node."""
    from scheduling.evaluation.ablations import StandbyNeverYields
    from scheduling.explain.template import TemplateExplainer
    from scheduling.packing import Cluster, Pod
    from scheduling.planning.agents import ClusterAgent
    from scheduling.planning.policies.rolling_lp import RollingLP, RollingLPOptions

    def fleet():
        agent = ClusterAgent(
            "c0", Cluster(["n0", "n1", "n2"], [96000] * 3, [262144] * 3, [8] * 3, ["V100"] * 3), policy="bestfit"
        )
        for node in (0, 1):
            busy = Pod(f"busy{node}", 1000, 1024, 8, 1000)
            agent.cluster.allocate(busy, node, tuple(range(8)))
            agent.end_hour[busy.pod_id] = 5
        return [agent]

    p = toy_problem(
        forecast=[[10]] * 8,
        free=[[8000]] * 5 + [[24000]] * 3,
        gpu=[1000, 1000],
        dur=[[2], [2]],
        kw=[[0.3], [0.3]],
        deadline=[2, 8],
    )
    p.jobs["num_gpu"] = 1
    pods = [Pod("j0", 1000, 1024, 1, 1000), Pod("j1", 1000, 1024, 1, 1000)]
    for yields in (False, True):
        agents = fleet()
        options = RollingLPOptions(capacity_factor=1.0)
        policy = RollingLP(options) if yields else StandbyNeverYields(options)
        out = policy.plan(p, agents, pods, 0, explain=True)
        assert agents[0].standby_nodes() == [2]
        due_now = out.placed[0] and out.s[0] == 0 and not out.late[0]
        assert due_now == yields, (yields, out.placed[0], out.s[0], out.late[0], out.reason[0])
        assert out.stats["n_due_on_standby"] == int(yields)
        assert out.node[1] != "n2" and out.status[1] != "dispatched"  # not due: waits for the busy nodes
    # the explanation says why a small job sits on a node kept for whole-node jobs
    assert out.node[0] == "n2"
    record = next(r for r in out.explanations if r["job_id"] == "j0")
    assert record["chosen"]["standby_node"] is True
    assert "standby node" in TemplateExplainer().explain(record)
    assert all("standby_node" not in r["chosen"] for r in out.explanations if r["job_id"] != "j0")
