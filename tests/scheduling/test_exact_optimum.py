"""The node-aware optimum on a small real instance (20 jobs, 1 day, 2 regions): HiGHS proves it, and its schedule,
checked here without the model, puts whole jobs on real nodes within every node's GPUs, CPU and memory each hour,
inside each job's window, at the carbon it reports."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.evaluation.bounds import optimum_problem, solve_optimum
from scheduling.evaluation.exact import node_table, solve_node_optimum
from scheduling.evaluation.scenario import build_scenario
from scheduling.planning.lp import candidates


@pytest.fixture(scope="module")
def instance(data_dir):
    return build_scenario(
        start="2021-07-05", days=1, n_jobs=20, regions=2, load=0.8, seed=3, forecasts="dacf",
        data_dir=data_dir, grid_source="files", tail_days=2,
    )  # fmt: skip


def test_the_node_optimum_is_proved_and_its_schedule_fits_the_nodes(instance):
    out = solve_node_optimum(instance, time_limit_s=120)
    assert out["status"] == "optimal" and out["mip_gap"] <= 0.01
    prob = optimum_problem(instance)
    node_cluster, cap = node_table(instance)
    req = np.column_stack([prob.gpu_total, prob.jobs["cpu_milli"], prob.jobs["memory_mib"]]).astype(float)
    placed = out["placement"]
    jobs = placed[:, 0]
    assert len(set(jobs)) == len(jobs) and set(jobs).isdisjoint(out["late_jobs"])
    assert len(jobs) + len(out["late_jobs"]) == prob.n_jobs
    use = np.zeros((prob.hours, len(node_cluster), 3))
    job, k, s, c, cost, late_cost, _ = candidates(prob)
    carbon = {(a, b, d, e): v for a, b, d, e, v in zip(job, k, s, c, cost)}
    total = 0.0
    for j, opt, start, node in placed:
        cl = node_cluster[node]
        run = prob.dur[j, opt, cl]
        assert prob.allowed[j, cl] and start >= prob.release[j] and start + run <= prob.deadline_rel[j] + 1e-9
        use[start : start + int(np.ceil(run - 1e-9)), node] += req[j]
        total += carbon[(j, opt, start, cl)]
    assert (use <= cap[None, :, :] + 1e-6).all()  # every node, hour and resource
    total += np.where(np.isfinite(late_cost), late_cost, 0.0)[out["late_jobs"]].sum()
    assert out["kgco2e"] == pytest.approx(total, rel=1e-9)
    # the LP pools each cluster's GPUs (and ignores CPU and memory): its deadlines are at least the node model's
    assert solve_optimum(instance)["deadline_satisfaction"] >= out["deadline_satisfaction"]


def test_evaluate_reports_each_policys_share_of_the_exact_optimum(instance):
    from scheduling.evaluation.results import evaluate

    rep = evaluate(instance, ["rolling-lp"], exact=True, exact_time_limit_s=120)
    exact = rep["exact_optimum"]
    assert exact["status"] == "optimal" and 0 < exact["deadline_satisfaction"] <= 1
    base = rep["policies"]["performance-first"]["kgco2e"]
    for m in (rep["policies"]["rolling-lp"], rep["optimum"]):
        expected = 100.0 * (base - m["kgco2e"]) / (base - exact["kgco2e"])
        assert m["share_of_exact_optimum_reduction_pct"] == pytest.approx(expected)
    assert rep["policies"]["performance-first"]["share_of_exact_optimum_reduction_pct"] == pytest.approx(0.0)
    from scheduling.evaluation.exact_report import exact_instances, exact_markdown, exact_summary

    (inst,) = exact_instances([rep])
    ours = inst["policies"]["rolling-lp"]
    assert (
        ours["share_of_exact_optimum_reduction_pct"]
        == rep["policies"]["rolling-lp"]["share_of_exact_optimum_reduction_pct"]
    )
    assert ours["deadline_satisfaction"] == rep["policies"]["rolling-lp"]["deadline_satisfaction"]
    summary = exact_summary([inst, inst])
    share = summary["policies"]["rolling-lp"]["share_of_exact_optimum_reduction_pct"]
    assert share["mean"] == share["min"] == pytest.approx(ours["share_of_exact_optimum_reduction_pct"])
    assert summary["targets"]["mean_share_ge_90_pct"] == (share["mean"] >= 90.0)
    assert inst["lp_bound_below_exact_pct"] == pytest.approx(
        100 * (exact["kgco2e"] - rep["optimum"]["kgco2e"]) / exact["kgco2e"]
    )
    assert any(line.startswith(f"| {inst['instance']} |") for line in exact_markdown([inst]))


def _brute_force(instance):
    """(least objective, least objective without capacity) of a tiny instance, by depth-first search over every
    job's candidates on every node that holds it and its late run, independent of the MILP: capacity checked per
    node, hour and resource."""
    prob = optimum_problem(instance)
    node_cluster, cap = node_table(instance)
    req = np.column_stack([prob.gpu_total, prob.jobs["cpu_milli"], prob.jobs["memory_mib"]]).astype(float)
    job, k, s, c, cost, late_cost, _ = candidates(prob)
    options = []
    for j in range(prob.n_jobs):
        mine = []
        for v in np.flatnonzero(job == j):
            occ = int(np.ceil(prob.dur[j, k[v], c[v]] - 1e-9))
            for n in np.flatnonzero(node_cluster == c[v]):
                if prob.jobs["num_gpu"].iat[j] * 1000 <= cap[n, 0] and np.all(req[j, 1:] <= cap[n, 1:]):
                    mine.append((float(cost[v]), n, int(s[v]), occ))
        late = late_cost[j] if np.isfinite(late_cost[j]) else 0.0
        mine.sort()
        options.append((mine, late + 1000.0))
    floor = [min([o[0] for o in mine] + [late]) for mine, late in options]
    rest = np.concatenate([np.cumsum(floor[::-1])[::-1], [0.0]])
    use = np.zeros((prob.hours, len(node_cluster), 3))
    best = [np.inf]

    def search(j, spent):
        if spent + rest[j] >= best[0] - 1e-9:
            return
        if j == prob.n_jobs:
            best[0] = spent
            return
        mine, late = options[j]
        for carbon, n, start, occ in mine:
            window = use[start : start + occ, n]
            if np.all(window + req[j] <= cap[n] + 1e-9):
                window += req[j]
                search(j + 1, spent + carbon)
                window -= req[j]
        search(j + 1, spent + late)

    search(0, 0.0)
    return best[0], sum(floor)


def test_a_tiny_instance_matches_exhaustive_search(data_dir):
    """Six one-GPU jobs on three nodes (1, 1 and 2 GPUs) where the nodes bind: the optimum costs more than every job
    at its own cheapest start, and the MILP finds the exhaustive search's minimum."""
    tiny = build_scenario(
        start="2021-07-05", days=0.5, n_jobs=6, regions=2, load=0.8, seed=3, forecasts="dacf",
        data_dir=data_dir, grid_source="files", tail_days=1,
    )  # fmt: skip
    out = solve_node_optimum(tiny, time_limit_s=60, mip_rel_gap=0.0)
    best, unconstrained = _brute_force(tiny)
    assert best > unconstrained + 0.05  # capacity binds, so the test can tell a wrong model
    late = 1000.0 * len(out["late_jobs"])
    assert out["status"] == "optimal"
    assert out["kgco2e"] + late == pytest.approx(best, rel=1e-6)
