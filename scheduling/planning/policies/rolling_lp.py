"""`rolling-lp`: model-predictive control with the optimum's LP.

Each planning hour the policy solves the relaxation of `optimum.solve_lp` on the problem it is handed -- the jobs
known now (pending, not started), the capacity left by the running jobs (`problem.free`), the *forecast* intensity
known now (`problem.forecast`, not the actual) over the plan horizon -- and then commits only the current hour.
Two reductions keep one plan of 1000 jobs x 168 h x 10 regions under a second (the full model took ~5 s): the
capacity rows are hourly for the first `hourly_rows` hours (24), then per 6-hour block (the block's mean), since
only hour 0 is committed and the rest is planned again; and a plan with more than `max_power_candidates`
candidates (60,000) keeps one power option per (job, start hour, cluster) -- the K-times smaller model: by default
(`power_reduction="cheapest"`) the option with the least forecast carbon there, which meets the deadline since only
timely candidates exist; at dispatch the option is chosen again (the least forecast carbon on the chosen cluster
that still meets the deadline and fits). Keeping power options in the LP where it is affordable is worth 4 points
of the optimum's share (July 2021, load 0.5: 54.1 -> 58.0 %). The 3000-job evaluations never exceed the limit
(38k candidates at most); a 9000-job one (414 GPUs, July 2021, load 0.5) does in most plans: the older reduction to
the default limit (`power_reduction="default"`) then captured 60.5 % of the optimum's reduction, the least-carbon
option 66.8 %, every option kept 68.7 % (at twice the run time). What it commits:

* a job whose LP mass at start hour 0 is at least `start_share` (default 0.5: "most of the job") starts now, on
  the (power option, cluster) candidate at hour 0 with the largest LP weight (then the next ones with weight, if
  the cluster agent rejects it; a job rejected everywhere stays pending for the next hour);
* a job whose latest timely start is now (no timely candidate after hour 0 in the LP's candidate set, which
  applies the deadline and the postpone margin) must start now: on its hour-0 LP candidates first, else the
  cheapest place now (forecast carbon) that has capacity and still meets the deadline, else (late) the one that
  ends first;
* every other job stays pending: its LP candidate with the largest weight after hour 0 is reported as tentative.

Forced jobs are offered first (earliest deadline first), then the LP's starts (largest hour-0 mass first).

`learn_prices=True` (not the registered default) adds the priority policy's learned capacity prices (`prices.py`:
LP duals of the last 72 h of arrivals, per hour of day and cluster) to the LP's objective, folded into the
intensity: a stand-in for the jobs that have not arrived yet, which the per-hour LP cannot see.
Expected arrivals (`expected_arrivals_h`, default 18): the LP also plans the jobs that arrived in the last 18 hours
again, shifted 18 hours later (`expected_jobs`; release and deadline shifted, planned for their capacity only, never
dispatched or reported): the per-hour LP otherwise sees only the jobs known now and promises them all the clean
capacity ahead, which the jobs arriving next then lack -- the information the offline bound has and we do not.
Window compared on September 2021 (not one of the reported periods), 2999 jobs: share of the optimum's reduction
/ deadlines at load 0.5 and 0.8: none 61.1 / 67.6 % (98.5 / 98.0 %), 12 h 70.2 / 71.1 %, 18 h 70.8 / 75.2 % (99.3 /
99.0 %), 24 h 70.6 / 61.3 % (97.8 % deadlines at 0.8: too much assumed demand in a busy fleet).
`clairvoyant_arrivals_h` (0, the default: off; evaluation only) replaces them by the trace's *true* arrivals of the
next that many hours: with oracle forecasts, the perfect-information reference of `simulator.evaluate`'s ablations
(over twelve 3000-job runs 74.6 % of the bound's reduction on average, 64.5-80.9 %; the default 71.5 %).
The standby pool (`standby_pool`, default on): on a cluster with at least three 8-GPU nodes, one such node in three,
and at most `standby_max_nodes` (default 1), is kept for whole-node jobs (`standby_job_gpus`, default 8 GPUs; `ClusterAgent.keep_standby`: other jobs may not
use it), and the LP sees that cluster as two, the standby nodes (open to the whole-node jobs one of them can hold)
and the rest (every other job). The standby is the node with the most CPU and memory: the openb 8-GPU jobs ask for
64.2-88 cores, which a 64-core 8-GPU node cannot give (CISO's cluster has one 82-core node among 64-core ones; the
first rule, the node that drains first, kept a 64-core node there and the 8-GPU jobs ran, late, on ISNE).
Why a standby: the 17 eight-GPU jobs of the evaluation trace (0.6 % of the jobs, 21 % of the energy) made 54-84 %
of rolling-lp's gap to the bound -- the bound runs them on the clean clusters' nodes, while online they waited for a
node that small jobs kept refilling and ended up, late, on ISNE's idle nodes. Measured on 2999 jobs at load 0.5
(before expected arrivals): July 57.8 -> 64.9 %, December 60.1 -> 69.5 % of the optimum's reduction, deadlines
99.4 -> 99.1 % / 99.5 -> 99.4 %; at load 0.8 the clusters have two 8-GPU nodes, no standby is kept and the plans
are unchanged. Letting short jobs (ending within
6 or 12 h) use the standby node did worse (July 0.5: 60.8 / 63.2 %). At most one standby node per cluster
(`standby_max_nodes`, stop 15): on a 9000-job trace (414 / 294 GPUs, six 8-GPU nodes per V100 cluster) one in three
kept two nodes per cluster idle for 39 whole-node jobs -- July 2021 load 0.8 then met 84 % of deadlines and captured
26 % of the optimum's reduction; with one node 96.9 % / 51.7 %, without a standby 99.4 % / 64.5 %; load 0.5: 66.8 ->
71.7 % with one node. The 3000-job evaluations keep at most one standby node per cluster either way (unchanged).
`standby_yields_to_due` (default on, stop 16): a job due now (no later timely start) that no other node takes in time
starts on a standby node (`_due_on_standby`; `ClusterAgent.offer(open_standby=True)`): a deadline outranks keeping
the node empty. 9000 jobs, naive forecasts: July 0.8 51.7 % / 96.9 % -> 60.7 % / 98.9 % (share / deadlines),
December 0.8 53.2 % / 97.6 % -> 59.1 % / 98.6 %; 3000 jobs July 0.5 (naive) 68.2 % / 99.7 % -> 67.6 % / 99.8 %.
`standby_below_utilization` (None, the default: off) gives the standby back while more than that share of the fleet's
GPUs is allocated (a busy fleet cannot spare the nodes). Without the yield, 9000 jobs July 0.8: 63.1 % / 99.4 % at
0.7, 57.9 % / 99.1 % at 0.75, 49.6 % / 96.9 % at 0.8; but at 0.7 the 3000-job July 0.5 run (naive) 65.5 % instead of
68.2 % (its allocation peaks at 73 %): a threshold that fits one fleet and load misfits another -- hence the yield.
`reserve_multi_gpu=True` (not the default) holds a node for each pending multi-GPU job on the cluster where the LP
plans it (`_reserve`: the node that drains first, open to jobs that end before the planned start, kept while the LP
keeps the job there) and gives the LP per-cluster earliest starts for these jobs (`_with_drain_release`: when that
node will have drained), only while the fleet's GPU allocation is at most `reserve_below_utilization` -- the other
answer to the eight-GPU jobs above. Measured (2999 jobs, before expected arrivals): always on, July/Dec load 0.5 58
-> 64 % / 60 -> 63 % of the optimum's reduction, but load 0.8 71 -> 40 % with deadlines 98.7 -> 88 % (draining nodes
idle capacity a busy fleet lacks); with the guard at 0.6: +2.5 / +1.2 / +0.4 / -0.6 points (Jul 0.5 / Dec 0.5 / Jul
0.8 / Dec 0.8), at 0.65 July 0.8 falls to 96 % deadlines. Too small and too fragile to be the default; preemption of
checkpointable jobs is the lever these jobs need.
`preemption` (a `types.Preemption`; None, the default: off): a job that is due now and that no node takes in time
is started where evicting running checkpointing jobs with slack makes room (`ClusterAgent.evict_for`; the cheapest
cluster first); the evicted jobs lose `overhead_h` of work and are planned again from the next hour
(`HourlyPlanner.preempt`, the simulator charges every run). With `for_carbon=True` an evictable job is also stopped
when resuming it later on the capacity the plan leaves emits `min_saving` less (`_stop_for_carbon`). Measured on
2999 jobs (stop 14; without: July 69.3 / 70.9 %, December 0.8 81.7 % of the optimum's reduction, deadlines 99.8 /
99.2 / 99.2 % at load 0.5 / 0.8): due jobs only, July 69.1 / 70.4 %, December 0.8 80.0 %, deadlines 99.83 / 99.40 /
99.43 % (20 / 12 / 14 preemptions; 3 of July 0.5's 17 preempted jobs then ran late); with `for_carbon`, July
69.2 / 61.6 %, deadlines 99.87 / 98.83 % (149 / 34 preemptions). Not the default: nothing gained, and at 0.8
stopping for carbon displaces other jobs.
The eight-GPU jobs are not helped: when one is due, every node that could hold it runs 6-11 jobs, of which 0-3 are
evictable (no checkpoints, or too little slack left), so no node can be emptied.
`capacity_factor` (default 0.85) plans the LP on that share of each cluster's GPU capacity: head-room for node
packing, which the LP's per-cluster capacity cannot see (the agents reject what does not fit on a node); the agents
and forced starts still use the whole cluster. Measured on 2999 jobs, July 2021 (fast LP): 0.9 instead of 1.0 gives
48.1 -> 54.1 % of the optimum's reduction and 98.9 -> 99.4 % deadlines at load 0.5, 60.8 -> 64.8 % and 96.9 ->
98.2 % at load 0.8. 0.85 instead of 0.9 (stop 13): with 0.9 the trace of seed 1 missed the deadline target at load
0.8 (97.6 % in July and December); 0.85 meets it in every run of seeds 0-2 (98.3-99.8 %) for about one point of share
(-1.0 on average over eight runs, from -3.4 to +3.3).
`warm_start=True` (not the default) starts each hour's LP from the basis of the last one (`optimum.WarmStart`):
the same optimum in fewer simplex iterations (HiGHS -21 ... -29 % per 3000-job run), but where the LP is degenerate
another optimal vertex now and then, which moves a run as any small change does; the README has the numbers.
"""
from __future__ import annotations

import time

import numpy as np

from scheduling.planning.agents import STANDBY
from scheduling.planning.candidates import Evaluator
from scheduling.planning.decision_records import explain_batch
from scheduling.planning.job_priority import priority_parts
from scheduling.planning.outcome import PlanOutcome, empty_decisions
from scheduling.planning.lp import WarmStart, solve_lp
from scheduling.planning.problem import abs_hours
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.problem import Preemption, PriorityWeights


class RollingLP(PlacementPolicy):
    """Re-solve the optimum's LP every hour on the known jobs and the forecast; start the jobs it starts now."""

    name = "rolling-lp"
    power_aware = True
    description = "MPC: the optimum's LP each hour on the known jobs and the forecast; start what it starts now"

    def __init__(self, start_share: float = 0.5, late_penalty_kg: float = 1000.0, time_limit_s: float = 60.0,
                 learn_prices: bool = False, capacity_factor: float = 0.85, max_power_candidates: int | None = 60_000,
                 hourly_rows: int | None = 24, max_lp_jobs: int | None = 1500, reserve_multi_gpu: bool = False,
                 max_reserved_nodes: int = 1, reserve_below_utilization: float = 1.0, standby_pool: bool = True,
                 standby_min_gpus: int = 8, standby_min_nodes: int = 3, standby_backfill_h: int = 0,
                 standby_job_gpus: int | None = None, standby_max_nodes: int | None = 1,
                 standby_below_utilization: float | None = None, standby_yields_to_due: bool = True,
                 expected_arrivals_h: int = 18, clairvoyant_arrivals_h: int = 0,
                 preemption: Preemption | None = None, power_reduction: str = "cheapest", warm_start: bool = False):
        from scheduling.planning.prices import PriceLearner

        self.max_power_candidates = max_power_candidates
        self.power_reduction = power_reduction
        self.max_lp_jobs = max_lp_jobs
        self.reserve_multi_gpu = reserve_multi_gpu
        self.max_reserved_nodes = max_reserved_nodes
        self.standby_pool = standby_pool
        self.standby_min_gpus = standby_min_gpus
        self.standby_min_nodes = standby_min_nodes
        self.standby_max_nodes = standby_max_nodes
        self.standby_below_utilization = standby_below_utilization
        self.standby_yields_to_due = standby_yields_to_due
        self.standby_backfill_h = standby_backfill_h
        self.standby_job_gpus = standby_min_gpus if standby_job_gpus is None else standby_job_gpus
        self.expected_arrivals_h = expected_arrivals_h
        self.clairvoyant_arrivals_h = clairvoyant_arrivals_h
        self.preemption = preemption
        self.reserve_below_utilization = reserve_below_utilization
        self.hourly_rows = hourly_rows
        self.start_share = start_share
        self.capacity_factor = capacity_factor
        self.prices = PriceLearner() if learn_prices else None
        self.late_penalty_kg = late_penalty_kg
        self.time_limit_s = time_limit_s
        self.warm = WarmStart() if warm_start else None
        self.last = None

    def capacity_prices(self, context, now_h, hours):
        """Optional (`learn_prices=True`): the priority policy's learned capacity prices (`prices.py`), the value
        of capacity to the jobs that will still arrive; folded into the LP's intensity (see `_priced`)."""
        if self.prices is None:
            return None
        self.prices.maybe_refresh(now_h, context.table, context.forecast_matrix, context.actual_matrix)
        return self.prices.prices(now_h, hours)

    def plan(self, problem, agents=None, pods=None, now_hour=None, *, explain=True, tentative=True):
        if self.max_lp_jobs is not None and problem.n_jobs > self.max_lp_jobs:
            return self._plan_head(problem, agents, pods, now_hour, explain=explain)
        return self._plan_lp(problem, agents, pods, now_hour, explain=explain)

    def _plan_lp(self, problem, agents, pods, now_hour, *, explain):
        t0 = time.perf_counter()
        p = problem
        N, C = p.n_jobs, p.n_clusters
        holds = self._holds_affordable(p, agents, pods)
        if holds:
            p = _with_drain_release(p, agents, pods, now_hour)
        p_lp = _with_expected(p) if p.expected is not None and p.expected.n_jobs else p
        split = self._standby_split(p_lp, agents, now_hour)
        if split is None:
            lp = self._solve(p_lp)
        else:  # solved on the split clusters, then every candidate refers to its real cluster again
            import dataclasses

            lp = self._solve(split[0])
            lp = dataclasses.replace(lp, c=split[1][lp.c])
        lp_all = lp
        if p_lp is not p:
            lp = _only_jobs(lp, N)
        self.last = lp
        t_lp = time.perf_counter() - t0
        job, x = lp.job, lp.x
        now_c = lp.s == 0
        mass0 = np.bincount(job[now_c], weights=x[now_c], minlength=N)
        has_later = np.bincount(job[~now_c], minlength=N) > 0
        forced = ~has_later
        go = (mass0 >= self.start_share - 1e-9) & ~forced

        k, s, c, cost, late, placed, reason, node, gpus, status, rejections = empty_decisions(N)
        free = p.free.astype(np.int64).copy()
        ev = Evaluator(p)

        first = np.searchsorted(job, np.arange(N + 1))  # candidates come job by job (solve_lp's order)

        def lp_now_options(j):
            """(k, c, cost) of job j's hour-0 LP candidates with weight, largest weight first."""
            v = np.arange(first[j], first[j + 1])
            v = v[now_c[v] & (x[v] > 1e-6)]
            v = v[np.argsort(-x[v], kind="stable")]
            return [(int(lp.k[i]), int(lp.c[i]), float(lp.cost[i]), False) for i in v]

        def fastest_now(j):
            """Hour-0 candidates with capacity for the whole run: timely ones by cost, else by end (late)."""
            view = ev.view(j, free, 1)
            ok = view.base_ok[:, 0, :] & view.cap_ok[:, 0, :]
            timely = ok & view.timely[:, 0, :]
            if timely.any():
                kk, cc = np.nonzero(timely)
                order = np.lexsort((view.end[kk, 0, cc], view.cost[kk, 0, cc]))
                return [(int(kk[i]), int(cc[i]), float(view.cost[kk[i], 0, cc[i]]), False) for i in order]
            kk, cc = np.nonzero(ok)
            order = np.lexsort((view.cost[kk, 0, cc], view.end[kk, 0, cc]))
            return [(int(kk[i]), int(cc[i]), float(view.cost[kk[i], 0, cc[i]]), True) for i in order]

        def power_now(j, kk, cc, cst, is_late):
            """Where the LP reduced the power options (a large plan): at dispatch, the power option with the
            least forecast carbon on that cluster that still meets the deadline and fits the capacity left."""
            if lp.power_reduction == "none" or is_late or p.dur.shape[1] == 1:
                return kk, cst
            cost_now, ok = ev.start_now(j, cc, free)
            if not ok.any():
                return kk, cst
            best = int(np.argmin(np.where(ok, cost_now, np.inf)))
            return best, float(cost_now[best])

        if holds:
            self._reserve(p, lp, agents, pods, now_hour)
        rejected_at: dict[int, set] = {}

        def start(j, options, open_standby: bool = False) -> bool:
            rejected = rejected_at.setdefault(j, set())
            for kk, cc, cst, is_late in options:
                if cc in rejected and not open_standby:
                    continue
                kk, cst = power_now(j, kk, cc, cst, is_late)
                occ = int(np.ceil(p.dur[j, kk, cc] - 1e-9))
                if agents is not None:
                    pl = agents[cc].offer(pods[j], now_hour + occ, open_standby=open_standby)
                    if pl is None:
                        rejected.add(cc)
                        rejections[j] += 1
                        continue
                    node[j], gpus[j] = pl.node_name, tuple(pl.gpus)
                k[j], s[j], c[j], cost[j], late[j], placed[j] = kk, 0, cc, cst, is_late, True
                status[j] = "dispatched"
                free[: occ, cc] -= p.gpu_total[j]
                return True
            return False

        deadline = p.deadline_rel
        f_idx = np.flatnonzero(forced)
        on_standby: set[int] = set()  # due jobs started on a standby node (`standby_yields_to_due`)
        evictable = dict(p.evictable or {}) if self.preemption is not None and agents is not None else {}
        evicted = []

        def evict_and_start(j) -> bool:
            """`preemption`: a due job that no node takes in time: on the cluster with the least forecast carbon (at
            its best timely option) where evicting running checkpointing jobs makes room, start it now."""
            if not evictable:
                return False
            view = ev.view(j, None, 1)
            ok = view.base_ok[:, 0, :] & view.timely[:, 0, :]
            cst = np.where(ok, view.cost[:, 0, :], np.inf)
            best_k = np.argmin(cst, axis=0)
            best = cst[best_k, np.arange(C)]
            for cc in np.argsort(best, kind="stable"):
                if not np.isfinite(best[cc]):
                    break
                cc, kk = int(cc), int(best_k[cc])
                occ = int(np.ceil(p.dur[j, kk, cc] - 1e-9))
                got = agents[cc].evict_for(pods[j], now_hour + occ, evictable)
                if got is None:
                    continue
                pl, victims = got
                for v in victims:
                    evictable.pop(v)
                    evicted.append((v, cc, str(p.jobs["job_id"].iat[j])))
                node[j], gpus[j] = pl.node_name, tuple(pl.gpus)
                k[j], s[j], c[j], cost[j], late[j], placed[j] = kk, 0, cc, float(best[cc]), False, True
                status[j] = "dispatched"
                free[:occ, cc] -= p.gpu_total[j]
                return True
            return False

        for j in f_idx[np.argsort(deadline[f_idx], kind="stable")]:
            j = int(j)
            opts = lp_now_options(j)
            if not start(j, opts):
                tried = {(kk, cc) for kk, cc, _, _ in opts}
                rest = [o for o in fastest_now(j) if (o[0], o[1]) not in tried]
                timely = [o for o in rest if not o[3]]
                if not start(j, timely):
                    if self._due_on_standby(j, opts + timely, agents, start):
                        on_standby.add(j)
                    elif not evict_and_start(j):
                        start(j, [o for o in rest if o[3]])
            if not placed[j]:
                reason[j] = "rejected_by_agents" if rejections[j] else "no_capacity_now"
        g_idx = np.flatnonzero(go)
        for j in g_idx[np.argsort(-mass0[g_idx], kind="stable")]:
            j = int(j)
            if not start(j, lp_now_options(j)):
                reason[j] = "rejected_by_agents"
        # the rest: the LP's heaviest candidate after hour 0, as a tentative start (re-planned next hour)
        later = np.flatnonzero(~now_c & (x > 1e-9))
        if len(later):
            o = later[np.lexsort((x[later], job[later]))]  # by job, then weight ascending: the last one wins
            last = np.r_[job[o][1:] != job[o][:-1], True]
            best = o[last]
            jb = job[best]
            free_j = ~(placed[jb] | forced[jb] | go[jb])
            best, jb = best[free_j], jb[free_j]
            k[jb], s[jb], c[jb], cost[jb] = lp.k[best], lp.s[best], lp.c[best], lp.cost[best]
        for j in range(N):
            if placed[j] or forced[j] or go[j]:
                continue
            if s[j] > 0:
                placed[j], status[j] = True, "tentative"
            else:
                reason[j] = "lp_late"
        if evictable and self.preemption.for_carbon and p.running is not None:
            self._stop_for_carbon(p, p_lp, lp_all, agents, evictable, evicted)
        prio = priority_parts(p, PriorityWeights())
        out = PlanOutcome(p, self.name, np.arange(N), k, s, c, cost, late, placed, reason, node, gpus, status,
                          rejections, prio, evicted=evicted)
        t_explain = time.perf_counter()
        if explain:
            lp_kg = lp.job_carbon(N)
            shown = np.flatnonzero(placed)
            # start hours up to a day past the latest timely start; the whole horizon where the pick lies beyond
            n_starts = [ev.starts_needed(int(j), 24) for j in shown]
            n_starts = np.array([p.hours if s[j] >= m else m for j, m in zip(shown, n_starts)], dtype=np.int64)
            by_n = np.argsort(n_starts, kind="stable")  # batches of like ranges: little computed past a job's own
            order = shown[by_n]
            rejected = np.zeros((N, C), dtype=bool)
            for j, where in rejected_at.items():
                rejected[j, list(where)] = True
            records = []
            for b in ev.each_batch(order, free, n_starts[by_n]):
                J = b.J
                records += explain_batch(p, self.name, b, b.cost, k[J], s[J], c[J], late[J], rejected[J], prio, ev,
                                         optimum_kg=lp_kg[J])
            for j, record in zip(order, records):
                if j in on_standby:
                    record["chosen"]["standby_node"] = True
            records = [records[i] for i in np.argsort(by_n)]  # back to plan order
            out.explanations.extend(records)
        out.stats = {"lp": lp.summary(), "lp_s": round(t_lp, 4), "plan_s": round(time.perf_counter() - t0, 4),
                     "explain_s": round(time.perf_counter() - t_explain, 4),
                     "agent_rejections": int(rejections.sum()), "n_jobs": int(N),
                     "n_started": int((placed & (s == 0)).sum()), "n_forced": int(forced.sum()),
                     "n_late": int((late & placed).sum()), "horizon_h": int(p.hours), "n_evicted": len(evicted),
                     "n_due_on_standby": len(on_standby)}
        return out

    def _stop_for_carbon(self, p, p_lp, lp, agents, evictable: dict, evicted: list) -> None:
        """`Preemption.for_carbon`: stop the evictable running jobs (`p.running`) whose cheapest resumption -- from
        the next hour, anywhere, on the capacity this plan leaves (the LP's capacity less what it plans for the
        pending and expected jobs, plus the job's own share) -- emits at least `min_saving` less than running on
        (forecast; the resumption's run time includes the preemption's lost work). Largest saving first; each one
        stopped takes its resumption's capacity from what is left."""
        r, on = p.running, p.runs_on
        H, C = p.hours, p.n_clusters
        resid = _derated(p, self.capacity_factor).free.astype(float)
        occ = np.ceil(p_lp.dur[lp.job, lp.k, lp.c] - 1e-9).astype(np.int64)
        g = p_lp.gpu_total[lp.job] * lp.x
        diff = np.zeros((H + 1, C))
        np.add.at(diff, (lp.s, lp.c), g)
        np.add.at(diff, (np.minimum(lp.s + occ, H), lp.c), -g)
        resid -= np.cumsum(diff, axis=0)[:H]
        F = p.forecast
        S = np.vstack([np.zeros((1, C)), np.cumsum(F, axis=0)])
        ev = Evaluator(r)
        ids = r.jobs["job_id"].astype(str).tolist()

        def saving(i):
            kk, cc, left = int(on[i, 0]), int(on[i, 1]), float(on[i, 2])
            whole = int(np.floor(left + 1e-9))
            if whole >= H:
                return None
            run_on = r.kw[i, kk, cc] / 1000.0 * (S[whole, cc] + (left - whole) * F[whole, cc])
            room = resid.copy()
            room[: int(np.ceil(left - 1e-9)), cc] += r.gpu_total[i]
            v = ev.view(i, np.maximum(room, 0).astype(np.int64))
            cost = np.where(v.feasible, v.cost, np.inf)
            b = np.unravel_index(int(np.argmin(cost)), cost.shape)
            if not np.isfinite(cost[b]) or run_on - cost[b] < self.preemption.min_saving * run_on:
                return None
            return run_on - cost[b], cc, b

        first = [(sv[0], i) for i in range(r.n_jobs) if ids[i] in evictable and (sv := saving(i)) is not None]
        for _, i in sorted(first, reverse=True):
            sv = saving(i)  # again: the jobs stopped before took capacity
            if sv is None:
                continue
            _, cc, (kb, sb, cb) = sv
            resid[sb: sb + int(np.ceil(r.dur[i, kb, cb] - 1e-9)), cb] -= r.gpu_total[i]
            agents[cc].release(ids[i])
            evictable.pop(ids[i])
            evicted.append((ids[i], cc, "carbon"))

    def expected_jobs(self, context, now, free, forecast):
        """`expected_arrivals_h` > 0: the jobs that arrived in the last that many hours, again as if they arrived
        that much later (release and deadline shifted; ids prefixed "expected:"): a forecast of the demand the LP
        cannot see, so that it does not promise all the clean capacity ahead to the jobs known now.
        `clairvoyant_arrivals_h` > 0 (evaluation only, the perfect-information reference): instead, the jobs that
        *will* arrive in the next that many hours, at their true times -- the simulator's trace holds them; a live
        plan's table holds only the jobs known, so there it finds none."""
        import dataclasses

        tbl = context.table
        now_h = abs_hours(now)
        if self.clairvoyant_arrivals_h:  # evaluation only: the trace's true next arrivals, as they will come
            W = int(self.clairvoyant_arrivals_h)
            idx = np.flatnonzero((tbl.submit_h > now_h) & (tbl.submit_h < now_h + W))
            shift = 0
        elif self.expected_arrivals_h:
            W = shift = int(self.expected_arrivals_h)
            idx = np.flatnonzero((tbl.submit_h >= now_h - W) & (tbl.submit_h < now_h))
        else:
            return None
        if not len(idx):
            return None
        release = np.maximum(tbl.submit_h[idx] + shift - now_h, 1)
        ex = tbl.problem(now, idx, free, forecast, power_aware=self.power_aware, release=release)
        jobs = ex.jobs.copy()
        jobs["job_id"] = "expected:" + jobs["job_id"].astype(str)
        return dataclasses.replace(ex, jobs=jobs, deadline_rel=ex.deadline_rel + shift)

    def _standby_split(self, p, agents, now_hour):
        """`standby_pool`: on every cluster with at least `standby_min_nodes` nodes of `standby_min_gpus` GPUs or
        more, one such node per `standby_min_nodes` is kept on standby for jobs of `standby_job_gpus` GPUs or more
        (`ClusterAgent.keep_standby`; other jobs may use it only if they end within `standby_backfill_h` hours), and
        the LP sees the cluster as two: the standby node, open only to those jobs that one of its nodes can hold
        (GPUs, CPU, memory), and the rest, open to the other jobs. Returns (the split problem, the real cluster of
        each of its clusters), or None when no cluster qualifies."""
        if not self.standby_pool or agents is None:
            return None
        import dataclasses

        num_gpu = p.jobs["num_gpu"].to_numpy()
        multi = num_gpu >= self.standby_job_gpus
        H, C = p.hours, p.n_clusters
        cpu, mem = p.jobs["cpu_milli"].to_numpy(), p.jobs["memory_mib"].to_numpy()
        cs, free_b, cap_b, fits_b = [], [], [], []
        if self.standby_below_utilization is not None:
            if _allocated_now(p) > self.standby_below_utilization:  # a busy fleet cannot spare the nodes
                for agent in agents:
                    for node in agent.standby_nodes():
                        del agent.reserved[node]
                return None
        for c, agent in enumerate(agents):
            n_standby = int((agent.cluster.gpu_count >= self.standby_min_gpus).sum()) // self.standby_min_nodes
            if self.standby_max_nodes is not None:
                n_standby = min(n_standby, self.standby_max_nodes)
            if n_standby < 1:
                continue
            nodes = agent.keep_standby(n_standby, now_hour + self.standby_backfill_h, self.standby_job_gpus)
            cl = agent.cluster
            cap = int(cl.gpu_count[nodes].sum()) * 1000
            # the standby part hosts only the jobs one of its nodes can hold (GPUs, CPU, memory)
            fits_b.append(((num_gpu[:, None] <= cl.gpu_count[nodes][None, :])
                           & (cpu[:, None] <= cl.cpu_capacity[nodes][None, :])
                           & (mem[:, None] <= cl.mem_capacity[nodes][None, :])).any(axis=1))
            cs.append(c)
            cap_b.append(cap)
            free_b.append(np.maximum(cap - agent.node_usage(nodes, now_hour, H), 0))
        if not cs:
            return None
        cs_arr = np.array(cs, dtype=np.int64)
        fb = np.stack(free_b, axis=1)  # (H, S)
        free = p.free.copy()
        free[:, cs_arr] = np.maximum(free[:, cs_arr] - fb, 0)
        allowed = p.allowed.copy()
        allowed[:, cs_arr] &= ~multi[:, None]
        capacity = np.asarray(p.capacity).copy()
        capacity[cs_arr] = capacity[cs_arr] - np.array(cap_b)

        def more(a, axis):
            return None if a is None else np.concatenate([a, np.take(a, cs_arr, axis=axis)], axis=axis)

        split = dataclasses.replace(
            p, clusters=list(p.clusters) + [f"{p.clusters[c]}/standby" for c in cs],
            regions=list(p.regions) + [p.regions[c] for c in cs], zones=list(p.zones) + [p.zones[c] for c in cs],
            gpu_models=list(p.gpu_models) + [p.gpu_models[c] for c in cs],
            capacity=np.concatenate([capacity, cap_b]), forecast=more(p.forecast, 1),
            free=np.concatenate([free, fb], axis=1), dur=more(p.dur, 2), kw=more(p.kw, 2),
            limit_w=more(p.limit_w, 1), allowed=np.concatenate([allowed, p.allowed[:, cs_arr] & multi[:, None]
                                                                   & np.stack(fits_b, axis=1)], 1),
            transfer_kwh=more(p.transfer_kwh, 1), renewable=more(p.renewable, 1),
            capacity_price=more(p.capacity_price, 1), release_c=more(p.release_c, 1),
            free_other=more(p.free_other, 2))
        return split, np.concatenate([np.arange(C), cs_arr])

    def _due_on_standby(self, j, options, agents, start) -> bool:
        """`standby_yields_to_due`: a job due now that no other node takes in time starts on a standby node (the
        timely options of clusters that keep one, cheapest first): a deadline outranks keeping the node empty."""
        if not self.standby_yields_to_due or agents is None:
            return False
        return start(j, [o for o in options if agents[o[1]].standby_nodes()], open_standby=True)

    def _holds_affordable(self, p, agents, pods) -> bool:
        """Node holds for multi-GPU jobs only while the fleet has head-room: a draining node idles capacity, which
        a busy fleet cannot spare. Above `reserve_below_utilization` (GPU allocation now) every hold is dropped."""
        if not self.reserve_multi_gpu or agents is None or pods is None:
            return False
        if _allocated_now(p) <= self.reserve_below_utilization:
            return True
        for agent in agents:
            for node in [n for n, (holder, _) in agent.reserved.items() if holder != STANDBY]:
                del agent.reserved[node]
        return False

    def _reserve(self, p, lp, agents, pods, now_hour) -> dict[str, str]:
        """`reserve_multi_gpu`: hold a node for every pending multi-GPU job on the cluster where the LP plans it,
        when no node there can take it now -- the node that drains first, kept for jobs that end before the
        job's planned start (`ClusterAgent.reserve`). Without it small jobs refill every node of the clean
        clusters and the whole-node jobs end up, late, wherever a node happens to be empty. Made again from the
        LP at every plan (one node per cluster, earliest planned start first). Returns {job id: node}."""
        weight, _, sb, cb = lp.heaviest(p.n_jobs)
        want = np.flatnonzero((p.jobs["num_gpu"].to_numpy() > 1) & (weight > 1e-9))
        want = want[np.argsort(sb[want], kind="stable")]
        ids = [pods[int(j)].pod_id for j in range(p.n_jobs)]
        # a hold stays with its job while the LP keeps some of the job on that cluster (a node that is draining
        # must not be swapped for another one every hour); holds of jobs planned elsewhere or gone are dropped
        mass_c = {}
        sel = lp.x > 1e-9
        for j, c in zip(lp.job[sel], lp.c[sel]):
            mass_c.setdefault(ids[int(j)], set()).add(int(c))
        for c, agent in enumerate(agents):
            for node, (holder, _) in list(agent.reserved.items()):
                if holder != STANDBY and c not in mass_c.get(holder, ()):
                    del agent.reserved[node]
        held = {}
        for j in want:
            agent, pod = agents[int(cb[j])], pods[int(j)]
            if agent.cluster.feasible(pod).any():
                continue
            node = agent.reserve(pod, self.max_reserved_nodes, until_h=now_hour + int(sb[j]))
            if node is not None:
                held[pod.pod_id] = node
        return held

    def _solve(self, p):
        return solve_lp(_derated(_priced(p), self.capacity_factor), self.late_penalty_kg, self.time_limit_s,
                        hourly_rows=self.hourly_rows, max_candidates=self.max_power_candidates, presolve=False,
                        power_reduction=self.power_reduction, warm=self.warm)

    def _plan_head(self, p, agents, pods, now_hour, *, explain):
        """A backlog above `max_lp_jobs`: the LP plans the `max_lp_jobs` jobs first in the issue's priority order
        (P = 0.35 U + 0.40 F + 0.25 O, lowest first: the urgent, inflexible ones); the others are deferred to the
        next hour (unplaced, reason `deferred_lp_budget`). Bounds the latency and memory of one plan (5000 jobs:
        32 s and 740 MB with the LP over all of them)."""
        prio = priority_parts(p, PriorityWeights())
        head = np.sort(np.argsort(prio.priority, kind="stable")[: self.max_lp_jobs])
        part = self._plan_lp(_subset(p, head), agents, [pods[i] for i in head] if pods is not None else None,
                             now_hour, explain=explain)
        N = p.n_jobs
        k, s, c, cost, late, placed, reason, node, gpus, status, rejections = empty_decisions(N)
        for arr, src in ((k, part.k), (s, part.s), (c, part.c), (cost, part.cost), (late, part.late),
                         (placed, part.placed), (rejections, part.rejections)):
            arr[head] = src
        for lst, src in ((reason, part.reason), (node, part.node), (gpus, part.gpus), (status, part.status)):
            for i, j in enumerate(head):
                lst[int(j)] = src[i]
        tail = np.setdiff1d(np.arange(N), head)
        for j in tail:
            reason[int(j)] = "deferred_lp_budget"
        out = PlanOutcome(p, self.name, np.arange(N), k, s, c, cost, late, placed, reason, node, gpus, status,
                          rejections, prio, part.explanations, evicted=part.evicted)
        out.stats = {**part.stats, "n_jobs": int(N), "n_deferred": int(len(tail))}
        return out


class ReplayPlan(RollingLP):
    """Diagnostic: execute a fixed offline plan {job_id: (power option, absolute start hour, cluster)} through the
    same hourly machinery (cluster agents, forced starts when a job is due): each hour, a job whose planned hour has
    come is offered to its planned cluster; one that cannot start there (no node fits) waits while it can and is
    then started where it still meets its deadline. Measures what node packing costs a plan made without it."""

    name = "replay-plan"
    description = "replay a fixed offline plan through the cluster agents (diagnostic)"

    def __init__(self, plan: dict):
        super().__init__(capacity_factor=1.0, max_power_candidates=None, max_lp_jobs=None, standby_pool=False,
                         expected_arrivals_h=0)
        self.fixed = plan

    def _solve(self, p):
        lp = solve_lp(p, self.late_penalty_kg, self.time_limit_s, presolve=False)
        now = int(abs_hours(p.now))
        x = np.zeros_like(lp.x)
        first = np.searchsorted(lp.job, np.arange(p.n_jobs + 1))
        for j, job_id in enumerate(p.jobs["job_id"].astype(str)):
            if job_id not in self.fixed:
                continue
            k, start, c = self.fixed[job_id]
            rel = max(int(start) - now, 0)
            v = np.arange(first[j], first[j + 1])
            hit = v[(lp.k[v] == k) & (lp.c[v] == c) & (lp.s[v] == rel)]
            later = v[lp.s[v] >= 1]
            if len(hit):
                x[hit[0]] = 1.0
            elif rel > 0 and len(later):  # keep it waiting for its planned hour
                x[later[0]] = 1.0
        lp.x = x
        return lp


def _allocated_now(p) -> float:
    """Share of the fleet's GPU-milli allocated now (hour 0 of the problem)."""
    return 1.0 - float(p.free[0].sum()) / max(float(np.sum(p.capacity)), 1.0)


_PER_JOB_FIELDS = ("release", "deadline_rel", "gpu_total", "dur", "kw", "allowed", "transfer_kwh", "home")


def _with_drain_release(p, agents, pods, now_hour):
    """The problem with per-cluster earliest starts for multi-GPU jobs that no node of a cluster can take now: the
    hour the node they hold there (or else the first node able to host them) has drained. The LP's per-cluster
    GPU count cannot see that a whole-node job waits for a node to empty."""
    import dataclasses

    multi = np.flatnonzero(p.jobs["num_gpu"].to_numpy() > 1)
    if not len(multi):
        return p
    rel = np.repeat(p.release[:, None], p.n_clusters, axis=1).astype(np.int64)
    for j in multi:
        pod = pods[int(j)]
        for c, agent in enumerate(agents):
            if not p.allowed[j, c] or agent.cluster.feasible(pod).any():
                continue
            opt = agent.drain_option(pod, max_reserved=len(agent.reserved) + 1)
            if opt is not None:
                rel[j, c] = max(rel[j, c], opt[1] - int(now_hour))
    return dataclasses.replace(p, release_c=rel)


def _with_expected(p):
    """The problem with its expected jobs appended (per-job arrays concatenated; capacity and hours unchanged)."""
    import dataclasses

    import pandas as pd

    e = p.expected
    per_job = {name: np.concatenate([getattr(p, name), getattr(e, name)]) for name in _PER_JOB_FIELDS}
    if p.req_other is not None and e.req_other is not None:
        per_job["req_other"] = np.concatenate([p.req_other, e.req_other])
    if p.release_c is not None:
        per_job["release_c"] = np.concatenate([p.release_c, np.repeat(e.release[:, None], p.n_clusters, 1)])
    return dataclasses.replace(p, jobs=pd.concat([p.jobs, e.jobs], ignore_index=True), pods=None, expected=None,
                               **per_job)


def _only_jobs(lp, n: int):
    """The LP result restricted to its first `n` jobs (the real ones; expected jobs come after them)."""
    import dataclasses

    keep = lp.job < n
    per_cand = {f: getattr(lp, f)[keep] for f in ("x", "job", "k", "s", "c", "cost", "energy_kwh", "renewable_kwh")}
    per_job = {f: getattr(lp, f)[:n] for f in ("u", "late_cost", "late_energy_kwh", "late_renewable_kwh",
                                                "late_start")}
    return dataclasses.replace(lp, objective_kg=float(per_cand["x"] @ per_cand["cost"] + per_job["u"] @
                                                      per_job["late_cost"]), **per_cand, **per_job)


def _subset(p, idx: np.ndarray):
    """The problem restricted to jobs `idx` (per-job arrays sliced; clusters, hours and capacity unchanged)."""
    import dataclasses

    per_job = {name: getattr(p, name)[idx] for name in _PER_JOB_FIELDS}
    if p.req_other is not None:
        per_job["req_other"] = p.req_other[idx]
    if p.release_c is not None:
        per_job["release_c"] = p.release_c[idx]
    if p.pods is not None:
        per_job["pods"] = [p.pods[i] for i in idx]
    return dataclasses.replace(p, jobs=p.jobs.iloc[idx].reset_index(drop=True), **per_job)


def _priced(p):
    """The problem with its capacity price (kg per GPU-milli-hour, or None) added to the intensity: a job draws
    kw = gpu_total x r[c] kW at the default power limit, so price x gpu_total per hour = kw x dF / 1000 with
    dF = 1000 x price / r[c] gCO2e/kWh (exact for the default limit; approximate for capped options)."""
    if p.capacity_price is None or not p.n_jobs:
        return p
    import dataclasses

    g = p.gpu_total.astype(float)
    ok = g > 0
    if not ok.any():
        return p
    r = np.median(p.kw[ok, 0, :] / g[ok, None], axis=0)  # (C,) kW per GPU-milli
    dF = 1000.0 * np.asarray(p.capacity_price, float) / np.maximum(r, 1e-12)[None, :]
    return dataclasses.replace(p, forecast=p.forecast + dF[: p.hours])


def _derated(p, factor: float):
    """The problem with (1 - factor) of each cluster's GPU capacity held back from the LP (head-room for node
    packing, which the LP's per-cluster capacity ignores); factor 1: unchanged."""
    if factor >= 1.0:
        return p
    import dataclasses

    hold = np.round((1.0 - factor) * np.asarray(p.capacity, float)).astype(np.int64)
    return dataclasses.replace(p, free=np.maximum(p.free - hold[None, :], 0))
