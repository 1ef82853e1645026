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
