"""The node-aware optimum: whole jobs on real nodes with perfect knowledge, as a MILP (HiGHS through scipy).

The LP bound (`bounds.solve_optimum`) pools each cluster's GPUs, so it can place a job on GPUs spread over several
nodes and split a job across hours and clusters. This model keeps the LP's candidates -- job j, power option k,
start hour s on cluster c, with the carbon of that run at the *actual* intensity, every job of the trace known at
the start, an empty fleet -- and places each timely candidate on one node of its cluster:

* binaries x[j, k, s, n] for every node n of c where the job fits (GPUs, CPU, memory), and u[j] (late);
* each job once:                 sum x[j, ., ., .] + u[j] = 1
* per node, hour and resource:   sum_{j,k,s: s <= h < s + occ} req_r(j) x[j, k, s, n] <= cap_r(n)
  (GPU-milli: num_gpu x gpu_milli against the node's GPUs x 1000; CPU milli-cores; memory MiB)
* objective: the candidates' carbon; u[j] its cheapest late run plus `late_penalty_kg` (as the LP).

What it bounds: every schedule of whole jobs on these nodes that meets as many deadlines emits at least this much.
Within a node the GPUs are one pool of GPU-milli, so GPU-sharing jobs are not packed onto single devices (exact for
whole-GPU jobs; for shared ones a relaxation of device packing). Late jobs take no capacity, as in the LP.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import sparse

from scheduling.evaluation.bounds import optimum_problem
from scheduling.evaluation.scenario_record import Scenario
from scheduling.planning.lp import assignment, candidates, held_in_horizon, solve_binary

_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded", 4: "numerical"}
# what a report keeps of a solve (the placement arrays stay out of JSON)
EXACT_KEYS = ("kgco2e", "deadline_satisfaction", "status", "mip_gap", "n_vars", "n_rows", "build_s", "solve_s")


def node_table(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """(cluster index per node, capacity per node as (GPU-milli, CPU milli-cores, memory MiB)) of the fleet."""
    cluster, caps = [], []
    for c, fc in enumerate(sc.fleet.clusters):
        nodes = fc.nodes
        cluster += [c] * len(nodes)
        caps.append(
            np.column_stack(
                [nodes["gpu"].to_numpy(float) * 1000.0, nodes["cpu_milli"].to_numpy(float), nodes["memory_mib"]]
            )
        )
    return np.asarray(cluster, dtype=np.int64), np.vstack(caps).astype(float)


def solve_node_optimum(
    sc: Scenario, time_limit_s: float = 600.0, mip_rel_gap: float = 0.01, late_penalty_kg: float = 1000.0
) -> dict:
    """The node-aware optimum of `sc` (see the module doc): carbon, deadline satisfaction, the MIP gap HiGHS
    proved, the model's size and the placement (job index, option, start hour, node index per placed job)."""
    t0 = time.perf_counter()
    prob = optimum_problem(sc)
    N, H = prob.n_jobs, prob.hours
    job, k, s, c, cost, late_cost, _ = candidates(prob)
    node_cluster, cap = node_table(sc)
    req = np.column_stack([prob.gpu_total.astype(float), prob.jobs["cpu_milli"], prob.jobs["memory_mib"]])
    gpus_needed = prob.jobs["num_gpu"].to_numpy(float) * 1000.0  # a job's GPUs on one node (whole devices)
    # expand each candidate to the nodes of its cluster that can hold the job alone
    cols_v, cols_n = [], []
    for cl in np.unique(c):
        v = np.flatnonzero(c == cl)
        nodes = np.flatnonzero(node_cluster == cl)
        fits = (gpus_needed[job[v], None] <= cap[None, nodes, 0]) & np.all(
            req[job[v], None, 1:] <= cap[None, nodes, 1:], axis=2
        )
        a, b = np.nonzero(fits)
        cols_v.append(v[a])
        cols_n.append(nodes[b])
    cv = np.concatenate(cols_v) if cols_v else np.zeros(0, dtype=np.int64)
    cn = np.concatenate(cols_n) if cols_n else np.zeros(0, dtype=np.int64)
    n = len(cv)
    occ = held_in_horizon(prob, job[cv], k[cv], s[cv], c[cv])
    # capacity rows (resource, hour, node): each column touches hours [s, s + occ) of its node
    var = np.repeat(np.arange(n), occ)
    hour = s[cv][var] + (np.arange(int(occ.sum())) - np.repeat(np.cumsum(occ) - occ, occ))
    n_nodes = len(node_cluster)
    rows = np.concatenate([(r * H + hour) * n_nodes + cn[var] for r in range(3)])
    vals = np.concatenate([req[job[cv][var], r] for r in range(3)])
    A_ub = sparse.csr_matrix((vals, (rows, np.tile(var, 3))), shape=(3 * H * n_nodes, n + N))
    b_ub = np.concatenate([np.repeat(cap[None, :, r], H, axis=0).reshape(-1) for r in range(3)])
    used = np.asarray(A_ub.getnnz(axis=1) > 0)
    A_ub, b_ub = A_ub[used], b_ub[used]
    A_eq, obj, lb_late = assignment(job[cv], N, cost[cv], late_cost, late_penalty_kg)
    build_s = time.perf_counter() - t0
    res = solve_binary(obj, A_ub, b_ub, A_eq, {"time_limit": time_limit_s, "mip_rel_gap": mip_rel_gap})
    status = _STATUS.get(res.status, str(res.status))
    if res.x is None:
        raise RuntimeError(f"the node-aware optimum: HiGHS found no schedule ({status}, {n + N} variables)")
    sol = np.round(res.x).astype(bool)
    x, u = sol[:n], sol[n:]
    placed = np.flatnonzero(x)
    return {
        "kgco2e": float(cost[cv][x].sum() + lb_late[u].sum()),
        "deadline_satisfaction": float(1.0 - u.sum() / max(N, 1)),
        "status": status,
        "mip_gap": None if getattr(res, "mip_gap", None) is None else float(res.mip_gap),
        "n_vars": int(n + N),
        "n_rows": int(A_ub.shape[0] + N),
        "build_s": round(build_s, 2),
        "solve_s": round(time.perf_counter() - t0 - build_s, 2),
        "placement": np.column_stack([job[cv][placed], k[cv][placed], s[cv][placed], cn[placed]]),
        "late_jobs": np.flatnonzero(u),
    }
