"""`rolling-lp`: model-predictive control with the optimum's LP.

Every planning hour the policy solves the LP relaxation of `lp.solve_lp` on what is known then -- the pending jobs,
the capacity the running jobs leave (`problem.free`) and the *forecast* intensity over the plan horizon -- and
commits only hour 0; the rest is planned again the next hour. What it commits:

* a job whose LP mass at start hour 0 is at least `start_share` starts now, on its hour-0 (power option, cluster)
  candidate with the largest LP weight (then the next ones, if the cluster agent rejects it);
* a job whose latest timely start is now (no timely candidate after hour 0) must start now: on its hour-0 LP
  candidates, else the cheapest place now (forecast carbon) that meets the deadline, else on a standby node, else
  (late) where it ends first;
* every other job waits: its heaviest LP candidate after hour 0 is reported as tentative.

A due job that no node takes, not even a standby node, starts where preempting running jobs makes room, when the
planner offers some (`problem.evictable`: checkpointing runs that keep their deadlines, `pausing.evictable_running`).

Due jobs are offered first (earliest deadline first), then the LP's starts (largest hour-0 mass first), then the
jobs whose deadline is already lost (no timely start left; earliest deadline first): under overload a job that can
still meet its deadline is never made late by one that cannot (earliest-deadline-first's domino effect), and the
overdue jobs take only the capacity the LP's plan leaves.

What the LP sees, and why (`RollingLPOptions` holds the defaults):

* Expected arrivals: the jobs that arrived in the last `expected_arrivals_h` hours, again, shifted that much later
  (planned for their capacity only, never dispatched). The per-hour LP sees only the jobs known now and would
  otherwise promise them all the clean capacity ahead, which the jobs arriving next then lack.
* Capacity head-room: the LP plans on `capacity_factor` of each cluster's GPUs, since its per-cluster capacity
  cannot see node packing (the agents reject what does not fit on a node); agents and forced starts use it all.
* Standby pool: on a cluster with at least `standby_min_nodes` nodes of `standby_min_gpus` GPUs, one such node per
  `standby_min_nodes` (at most `standby_max_nodes`; the one with the most CPU and memory) is kept for whole-node
  jobs, and the LP sees the cluster as two: the standby nodes, open only to the whole-node jobs they can hold, and
  the rest. Otherwise small jobs keep refilling every node of the clean clusters, and the whole-node jobs -- few, but
  a large share of the energy -- run late wherever a node is empty. A job due now that no other node takes may
  start on a standby node: a deadline outranks keeping the node empty.
* Size: capacity rows are hourly for the first `hourly_rows` hours, then per 6-hour block (the block's mean), since
  only hour 0 is committed; above `max_power_candidates` candidates one power option per (job, start hour,
  cluster) is kept, the one with the least forecast carbon, and the option is chosen again at dispatch; above
  `max_lp_jobs` pending jobs the LP plans the jobs due now and then the most urgent ones and defers the rest to the
  next hour, and sees the same share of the expected jobs, each standing for those dropped beside it
  (`_thinned_expected`).

A capacity price on the problem (`problem.capacity_price`) is added to the intensity the LP minimises (`_priced`).
The variants evaluated beside it (warm start, learned prices, clairvoyant arrivals, node holds, standby variants) are
subclasses in `scheduling.evaluation.ablations` that override the hooks below. Preemption is the planner's own
(`problem.evictable`, offered by `pausing.evictable_running` where it is on).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scheduling.planning.candidates import Evaluator, due_now
from scheduling.planning.decision_records import explain_batch
from scheduling.planning.job_priority import priority_parts
from scheduling.planning.lp import LPResult, solve_lp
from scheduling.planning.outcome import PlanOutcome, empty_decisions, lp_unplaced_reason, unplaced_reason
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.problem import PriorityWeights, abs_hours


@dataclass(frozen=True)
class RollingLPOptions:
    """The adopted configuration of `RollingLP`; every field's default is what the hourly plan runs."""

    start_share: float = 0.5  # start a job now when at least this share of its LP mass is at hour 0
    late_penalty_kg: float = 1000.0  # LP cost of running a job late, on top of its carbon
    time_limit_s: float = 60.0  # HiGHS time limit per plan
    capacity_factor: float = 0.85  # share of each cluster's GPU capacity the LP plans on (head-room for packing)
    max_power_candidates: int | None = 60_000  # above: one power option per (job, start, cluster); None: no limit
    hourly_rows: int | None = 24  # hourly capacity rows for this many hours, then 6-hour blocks; None: all hourly
    max_lp_jobs: int | None = 1500  # the LP plans at most this many jobs (priority order); the rest wait an hour
    standby_pool: bool = True  # keep standby nodes for whole-node jobs (see the module docstring)
    standby_min_gpus: int = 8  # nodes of this many GPUs or more qualify; jobs of this many GPUs may use them
    standby_min_nodes: int = 3  # one standby node per this many qualifying nodes of a cluster
    standby_max_nodes: int | None = 1  # at most this many standby nodes per cluster; None: no limit
    expected_arrivals_h: int = 18  # replay the arrivals of the last this many hours as expected jobs; 0: none
    overdue_last: bool = True  # jobs past their last timely start go after the LP's starts (see the module doc)


class Dispatch:
    """One plan's decisions, made job by job on the LP's solution: `start` offers a job to the cluster agents on its
    options in order and `commit`s the first that takes it (start now, its GPUs taken from `free`)."""

    def __init__(self, p, lp: LPResult, agents, pods, now_hour):
        self.p, self.lp, self.agents, self.pods, self.now_hour = p, lp, agents, pods, now_hour
        N = p.n_jobs
        (
            self.k,
            self.s,
            self.c,
            self.cost,
            self.late,
            self.placed,
            self.reason,
            self.node,
            self.gpus,
            self.status,
            self.rejections,
        ) = empty_decisions(N)
        self.free = p.free.astype(np.int64).copy()
        self.ev = Evaluator(p)
        self.now_c = lp.s == 0
        self.first = np.searchsorted(lp.job, np.arange(N + 1))  # candidates come job by job (solve_lp's order)
        self.rejected_at: dict[int, set] = {}  # clusters whose agent rejected the job
        self.on_standby: set[int] = set()  # due jobs started on a standby node
        self.evicted: list = []  # running jobs preempted: [(job id, cluster, what for)]
        self.evictable: dict[str, float] = {}  # running jobs that may still be preempted: job id -> cost

    def occupancy(self, j: int, kk: int, cc: int) -> int:
        """Whole hours job j occupies at option kk on cluster cc."""
        return int(np.ceil(self.p.dur[j, kk, cc] - 1e-9))

    def lp_now_options(self, j: int) -> list[tuple]:
        """(k, c, cost, late) of job j's hour-0 LP candidates with weight, largest weight first."""
        lp = self.lp
        v = np.arange(self.first[j], self.first[j + 1])
        v = v[self.now_c[v] & (lp.x[v] > 1e-6)]
        v = v[np.argsort(-lp.x[v], kind="stable")]
        return [(int(lp.k[i]), int(lp.c[i]), float(lp.cost[i]), False) for i in v]

    def fastest_now(self, j: int) -> list[tuple]:
        """Hour-0 candidates with capacity for the whole run: timely ones by cost, else by end (late)."""
        view = self.ev.view(j, self.free, 1)
        ok = view.base_ok[:, 0, :] & view.cap_ok[:, 0, :]
        timely = ok & view.timely[:, 0, :]
        if timely.any():
            kk, cc = np.nonzero(timely)
            order = np.lexsort((view.end[kk, 0, cc], view.cost[kk, 0, cc]))
            return [(int(kk[i]), int(cc[i]), float(view.cost[kk[i], 0, cc[i]]), False) for i in order]
        kk, cc = np.nonzero(ok)
        order = np.lexsort((view.cost[kk, 0, cc], view.end[kk, 0, cc]))
        return [(int(kk[i]), int(cc[i]), float(view.cost[kk[i], 0, cc[i]]), True) for i in order]

    def power_now(self, j: int, kk: int, cc: int, cst: float, is_late: bool) -> tuple[int, float]:
        """Where the LP reduced the power options (a large plan): the option with the least forecast carbon on that
        cluster that still meets the deadline and fits the capacity left."""
        if self.lp.power_reduction == "none" or is_late or self.p.dur.shape[1] == 1:
            return kk, cst
        cost_now, ok = self.ev.start_now(j, cc, self.free)
        if not ok.any():
            return kk, cst
        best = int(np.argmin(np.where(ok, cost_now, np.inf)))
        return best, float(cost_now[best])

    def commit(self, j: int, kk: int, cc: int, cost: float, late: bool, placement=None) -> None:
        """Job j starts now at option kk on cluster cc (on `placement`'s node, where agents place it)."""
        if placement is not None:
            self.node[j], self.gpus[j] = placement.node_name, tuple(placement.gpus)
        self.k[j], self.s[j], self.c[j], self.cost[j], self.late[j], self.placed[j] = kk, 0, cc, cost, late, True
        self.status[j] = "dispatched"
        self.free[: self.occupancy(j, kk, cc), cc] -= self.p.gpu_total[j]

    def start(self, j: int, options: list[tuple], open_standby: bool = False) -> bool:
        """Offer job j on `options` [(k, c, cost, late)] in order, skipping clusters that rejected it (unless
        `open_standby`: their standby nodes are open to it now); True once an agent (or, without agents, the
        capacity view) takes it."""
        rejected = self.rejected_at.setdefault(j, set())
        for kk, cc, cst, is_late in options:
            if cc in rejected and not open_standby:
                continue
            kk, cst = self.power_now(j, kk, cc, cst, is_late)
            placement = None
            if self.agents is not None:
                placement = self.agents[cc].offer(
                    self.pods[j], self.now_hour + self.occupancy(j, kk, cc), open_standby=open_standby
                )
                if placement is None:
                    rejected.add(cc)
                    self.rejections[j] += 1
                    continue
            self.commit(j, kk, cc, cst, is_late, placement)
            return True
        return False


class RollingLP(PlacementPolicy):
    """Re-solve the optimum's LP every hour on the known jobs and the forecast; start the jobs it starts now.

    `options`: the configuration (`RollingLPOptions()`, the adopted one, by default)."""

    name = "rolling-lp"
    power_aware = True
    description = "MPC: the optimum's LP each hour on the known jobs and the forecast; start what it starts now"

    def __init__(self, options: RollingLPOptions | None = None):
        self.options = options or RollingLPOptions()
        self.last: LPResult | None = None  # the last plan's LP solution (its real jobs only)

    def plan(self, problem, agents=None, pods=None, now_hour=None, *, explain=True, tentative=True):
        limit = self.options.max_lp_jobs
        if limit is not None and problem.n_jobs > limit:
            return self._plan_head(problem, agents, pods, now_hour, explain=explain)
        return self._plan_lp(problem, agents, pods, now_hour, explain=explain)

    # ------------------------------------------------------------------ hooks (see scheduling.evaluation.ablations)
    def _prepare(self, p, agents, pods, now_hour):
        """The problem the plan works on (before expected jobs are added); the one handed in."""
        return p

    def _solve_options(self) -> dict:
        """Further keyword arguments of `solve_lp` (warm start, power reduction); none."""
        return {}

    def _before_dispatch(self, d: Dispatch) -> None:
        """Called with the LP solved, before the first job is offered to the agents: the running jobs this hour may
        preempt (`problem.evictable`; the planner offers them where preemption is on)."""
        d.evictable = dict(d.p.evictable or {}) if d.agents is not None else {}

    def _due_on_standby(self, d: Dispatch, j: int, options: list[tuple]) -> bool:
        """A job due now that no other node takes starts on a standby node (the timely options of clusters that
        keep one, cheapest first): a deadline outranks keeping the node empty."""
        if d.agents is None:
            return False
        return d.start(j, [o for o in options if d.agents[o[1]].standby_nodes()], open_standby=True)

    def _start_by_eviction(self, d: Dispatch, j: int) -> bool:
        """A due job that no node takes, not even a standby node, starts now where preempting running checkpointing
        jobs (`d.evictable`) makes room (`ClusterAgent.evict_for`: the cheapest victims of a node), on the cluster
        with the least forecast carbon at the job's best timely option first."""
        if not d.evictable:
            return False
        p = d.p
        view = d.ev.view(j, None, 1)
        ok = view.base_ok[:, 0, :] & view.timely[:, 0, :]
        cst = np.where(ok, view.cost[:, 0, :], np.inf)
        best_k = np.argmin(cst, axis=0)
        best = cst[best_k, np.arange(p.n_clusters)]
        for cc in np.argsort(best, kind="stable"):
            if not np.isfinite(best[cc]):
                break
            cc, kk = int(cc), int(best_k[cc])
            got = d.agents[cc].evict_for(d.pods[j], d.now_hour + d.occupancy(j, kk, cc), d.evictable)
            if got is None:
                continue
            placement, victims = got
            for v in victims:
                d.evictable.pop(v)
                d.evicted.append((v, cc, str(p.jobs["job_id"].iat[j])))
            d.commit(j, kk, cc, float(best[cc]), False, placement)
            return True
        return False

    def _after_dispatch(self, d: Dispatch, p_lp, lp_all: LPResult) -> None:
        """Called after every job is decided, with the LP's problem and solution (expected jobs included)."""

    def _expected_arrivals(self, tbl, now_h: int) -> tuple[np.ndarray, int] | None:
        """(indexes into the job table, hours to shift them) of the expected jobs: the arrivals of the last
        `expected_arrivals_h` hours, shifted that much later; None: no expected jobs."""
        W = int(self.options.expected_arrivals_h)
        if not W:
            return None
        return np.flatnonzero((tbl.submit_h >= now_h - W) & (tbl.submit_h < now_h)), W

    def _standby_job_gpus(self) -> int:
        """Jobs of this many GPUs or more may use a standby node."""
        return self.options.standby_min_gpus

    def _standby_until(self, now_hour: int) -> int:
        """Other jobs may use a standby node only if they end by this hour: now (none may)."""
        return now_hour

    def _give_back_standby(self, p, agents) -> bool:
        """True: keep no standby node this hour (the standby nodes are released); never."""
        return False

    # ------------------------------------------------------------------ the plan
    def _plan_lp(self, problem, agents, pods, now_hour, *, explain):
        t0 = time.perf_counter()
        p = self._prepare(problem, agents, pods, now_hour)
        N = p.n_jobs
        p_lp = _with_expected(p) if p.expected is not None and p.expected.n_jobs else p
        split = self._standby_split(p_lp, agents, now_hour)
        if split is None:
            lp = self._solve(p_lp)
        else:  # solved on the split clusters, then every candidate refers to its real cluster again
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
        go = (mass0 >= self.options.start_share - 1e-9) & ~forced

        d = Dispatch(p, lp, agents, pods, now_hour)
        self._before_dispatch(d)
        overdue = forced & (np.bincount(job, minlength=N) == 0)  # no timely candidate: deadline lost, or no room
        first = forced & ~overdue if self.options.overdue_last else forced
        for j in _by_deadline(p, first):
            self._start_due(d, j)
        g_idx = np.flatnonzero(go)
        for j in g_idx[np.argsort(-mass0[g_idx], kind="stable")]:
            j = int(j)
            if not d.start(j, d.lp_now_options(j)):
                d.reason[j] = "rejected_by_agents"
        if self.options.overdue_last:
            for j in _by_deadline(p, overdue):
                self._start_due(d, j)
        k, s, c, cost, late, placed, reason, status = d.k, d.s, d.c, d.cost, d.late, d.placed, d.reason, d.status
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
                reason[j] = lp_unplaced_reason(p, j, d.ev.latest_start(j))
        self._after_dispatch(d, p_lp, lp_all)
        prio = priority_parts(p, PriorityWeights())
        out = PlanOutcome(
            p,
            self.name,
            np.arange(N),
            k,
            s,
            c,
            cost,
            late,
            placed,
            reason,
            d.node,
            d.gpus,
            status,
            d.rejections,
            prio,
            evicted=d.evicted,
        )
        t_explain = time.perf_counter()
        if explain:
            out.explanations.extend(self._explain(d, prio))
        out.stats = {
            "lp": lp.summary(),
            "lp_s": round(t_lp, 4),
            "plan_s": round(time.perf_counter() - t0, 4),
            "explain_s": round(time.perf_counter() - t_explain, 4),
            "agent_rejections": int(d.rejections.sum()),
            "n_jobs": int(N),
            "n_started": int((placed & (s == 0)).sum()),
            "n_forced": int(forced.sum()),
            "n_late": int((late & placed).sum()),
            "horizon_h": int(p.hours),
            "n_evicted": len(d.evicted),
            "n_due_on_standby": len(d.on_standby),
        }
        return out

    def _start_due(self, d: Dispatch, j: int) -> None:
        """Job j must start now: on its hour-0 LP candidates, else the cheapest timely place now, else a standby
        node, else by eviction (`_start_by_eviction`), else late where it ends first; or it waits (reason kept)."""
        opts = d.lp_now_options(j)
        if not d.start(j, opts):
            tried = {(kk, cc) for kk, cc, _, _ in opts}
            rest = [o for o in d.fastest_now(j) if (o[0], o[1]) not in tried]
            timely = [o for o in rest if not o[3]]
            if not d.start(j, timely):
                if self._due_on_standby(d, j, opts + timely):
                    d.on_standby.add(j)
                elif not self._start_by_eviction(d, j):
                    d.start(j, [o for o in rest if o[3]])
        if not d.placed[j]:
            d.reason[j] = unplaced_reason(d.p, j, d.rejections[j], now_only=True)

    def _explain(self, d: Dispatch, prio) -> list[dict]:
        """Explanation records of the placed jobs in plan order, with the LP's carbon of each job as the optimum
        counterfactual; start hours are evaluated up to a day past each job's latest timely start (the whole
        horizon where the pick lies beyond)."""
        p, ev, N, C = d.p, d.ev, d.p.n_jobs, d.p.n_clusters
        lp_kg = d.lp.job_carbon(N)
        shown = np.flatnonzero(d.placed)
        n_starts = [ev.starts_needed(int(j), 24) for j in shown]
        n_starts = np.array([p.hours if d.s[j] >= m else m for j, m in zip(shown, n_starts)], dtype=np.int64)
        by_n = np.argsort(n_starts, kind="stable")  # batches of like ranges: little computed past a job's own
        order = shown[by_n]
        rejected = np.zeros((N, C), dtype=bool)
        for j, where in d.rejected_at.items():
            rejected[j, list(where)] = True
        records = []
        for b in ev.each_batch(order, d.free, n_starts[by_n]):
            J = b.J
            records += explain_batch(
                p, self.name, b, b.cost, d.k[J], d.s[J], d.c[J], d.late[J], rejected[J], prio, ev, optimum_kg=lp_kg[J]
            )
        for j, record in zip(order, records):
            if j in d.on_standby:
                record["chosen"]["standby_node"] = True
        return [records[i] for i in np.argsort(by_n)]  # back to plan order

    def _solve(self, p) -> LPResult:
        """The LP on `p` with its capacity price folded into the intensity and `capacity_factor` of the capacity."""
        o = self.options
        return solve_lp(
            derated(_priced(p), o.capacity_factor),
            o.late_penalty_kg,
            o.time_limit_s,
            hourly_rows=o.hourly_rows,
            max_candidates=o.max_power_candidates,
            presolve=False,
            **self._solve_options(),
        )

    def _plan_head(self, p, agents, pods, now_hour, *, explain):
        """A backlog above `max_lp_jobs`: the LP plans the `max_lp_jobs` jobs first: those due now (`due_now`: an
        hour later they are late), then in priority order (P = 0.35 U + 0.40 F + 0.25 O, lowest first: the urgent,
        inflexible ones); the others are deferred to the next hour (unplaced, reason `deferred_lp_budget`). Bounds the
        latency and memory of one plan."""
        prio = priority_parts(p, PriorityWeights())
        head = np.sort(np.lexsort((prio.priority, ~due_now(p)))[: self.options.max_lp_jobs])
        N = p.n_jobs
        sub = _thinned_expected(_subset(p, head), len(head) / N)
        head_pods = [pods[i] for i in head] if pods is not None else None
        part = self._plan_lp(sub, agents, head_pods, now_hour, explain=explain)
        k, s, c, cost, late, placed, reason, node, gpus, status, rejections = empty_decisions(N)
        for arr, src in (
            (k, part.k),
            (s, part.s),
            (c, part.c),
            (cost, part.cost),
            (late, part.late),
            (placed, part.placed),
            (rejections, part.rejections),
        ):
            arr[head] = src
        for lst, src in ((reason, part.reason), (node, part.node), (gpus, part.gpus), (status, part.status)):
            for i, j in enumerate(head):
                lst[int(j)] = src[i]
        tail = np.setdiff1d(np.arange(N), head)
        for j in tail:
            reason[int(j)] = "deferred_lp_budget"
        out = PlanOutcome(
            p,
            self.name,
            np.arange(N),
            k,
            s,
            c,
            cost,
            late,
            placed,
            reason,
            node,
            gpus,
            status,
            rejections,
            prio,
            part.explanations,
            evicted=part.evicted,
        )
        out.stats = {**part.stats, "n_jobs": int(N), "n_deferred": int(len(tail))}
        return out

    def expected_jobs(self, context, now, free, forecast):
        """The expected jobs (`_expected_arrivals`) as a problem: release and deadline shifted, ids prefixed
        "expected:"; planned for their capacity only, so that the LP does not promise all the clean capacity
        ahead to the jobs known now. None when there are none."""
        tbl = context.table
        now_h = abs_hours(now)
        picked = self._expected_arrivals(tbl, now_h)
        if picked is None or not len(picked[0]):
            return None
        idx, shift = picked
        release = np.maximum(tbl.submit_h[idx] + shift - now_h, 1)
        ex = tbl.problem(now, idx, free, forecast, power_aware=self.power_aware, release=release)
        jobs = ex.jobs.copy()
        jobs["job_id"] = "expected:" + jobs["job_id"].astype(str)
        return dataclasses.replace(ex, jobs=jobs, deadline_rel=ex.deadline_rel + shift)

    def _standby_split(self, p, agents, now_hour):
        """The standby pool: on every cluster with at least `standby_min_nodes` nodes of `standby_min_gpus` GPUs or
        more, one such node per `standby_min_nodes` (at most `standby_max_nodes`) is kept on standby for jobs of
        `_standby_job_gpus()` GPUs or more (`ClusterAgent.keep_standby`), and the LP sees the cluster as two: the
        standby nodes, open only to those jobs that one of them can hold (GPUs, CPU, memory), and the rest, open
        to the other jobs. Returns (the split problem, the real cluster of each of its clusters), or None when no
        cluster qualifies."""
        o = self.options
        if not o.standby_pool or agents is None or self._give_back_standby(p, agents):
            return None
        job_gpus = self._standby_job_gpus()
        num_gpu = p.jobs["num_gpu"].to_numpy()
        multi = num_gpu >= job_gpus
        H, C = p.hours, p.n_clusters
        cpu, mem = p.jobs["cpu_milli"].to_numpy(), p.jobs["memory_mib"].to_numpy()
        cs, free_b, cap_b, fits_b = [], [], [], []
        for c, agent in enumerate(agents):
            n_standby = int((agent.cluster.gpu_count >= o.standby_min_gpus).sum()) // o.standby_min_nodes
            if o.standby_max_nodes is not None:
                n_standby = min(n_standby, o.standby_max_nodes)
            if n_standby < 1:
                continue
            nodes = agent.keep_standby(n_standby, self._standby_until(now_hour), job_gpus)
            cl = agent.cluster
            cap = int(cl.gpu_count[nodes].sum()) * 1000
            # the standby part hosts only the jobs one of its nodes can hold (GPUs, CPU, memory)
            fits_b.append(
                (
                    (num_gpu[:, None] <= cl.gpu_count[nodes][None, :])
                    & (cpu[:, None] <= cl.cpu_capacity[nodes][None, :])
                    & (mem[:, None] <= cl.mem_capacity[nodes][None, :])
                ).any(axis=1)
            )
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
            p,
            clusters=list(p.clusters) + [f"{p.clusters[c]}/standby" for c in cs],
            regions=list(p.regions) + [p.regions[c] for c in cs],
            zones=list(p.zones) + [p.zones[c] for c in cs],
            gpu_models=list(p.gpu_models) + [p.gpu_models[c] for c in cs],
            capacity=np.concatenate([capacity, cap_b]),
            forecast=more(p.forecast, 1),
            free=np.concatenate([free, fb], axis=1),
            dur=more(p.dur, 2),
            kw=more(p.kw, 2),
            limit_w=more(p.limit_w, 1),
            allowed=np.concatenate([allowed, p.allowed[:, cs_arr] & multi[:, None] & np.stack(fits_b, axis=1)], 1),
            transfer_kwh=more(p.transfer_kwh, 1),
            renewable=more(p.renewable, 1),
            capacity_price=more(p.capacity_price, 1),
            release_c=more(p.release_c, 1),
            free_other=more(p.free_other, 2),
            speed=more(p.speed, 1),
        )
        return split, np.concatenate([np.arange(C), cs_arr])


_PER_JOB_FIELDS = ("release", "deadline_rel", "gpu_total", "dur", "kw", "allowed", "transfer_kwh", "home")


def _by_deadline(p, mask: np.ndarray) -> list[int]:
    """The jobs of `mask`, earliest deadline first."""
    idx = np.flatnonzero(mask)
    return [int(j) for j in idx[np.argsort(p.deadline_rel[idx], kind="stable")]]


def _with_expected(p):
    """The problem with its expected jobs appended (per-job arrays concatenated; capacity and hours unchanged)."""
    e = p.expected
    per_job = {name: np.concatenate([getattr(p, name), getattr(e, name)]) for name in _PER_JOB_FIELDS}
    if p.req_other is not None and e.req_other is not None:
        per_job["req_other"] = np.concatenate([p.req_other, e.req_other])
    if p.release_c is not None:
        per_job["release_c"] = np.concatenate([p.release_c, np.repeat(e.release[:, None], p.n_clusters, 1)])
    per_job["speed"] = np.concatenate([p.speed, e.speed]) if p.speed is not None and e.speed is not None else None
    if p.deadline_spare is not None and e.deadline_spare is not None:
        per_job["deadline_spare"] = np.concatenate([p.deadline_spare, e.deadline_spare])
    if p.run_now_dur is not None:
        e_whole = e.run_now_dur if e.run_now_dur is not None else e.dur[:, 0]
        per_job["run_now_dur"] = np.concatenate([p.run_now_dur, e_whole])
    return dataclasses.replace(
        p, jobs=pd.concat([p.jobs, e.jobs], ignore_index=True), pods=None, expected=None, **per_job
    )


def _only_jobs(lp, n: int):
    """The LP result restricted to its first `n` jobs (the real ones; expected jobs come after them)."""
    keep = lp.job < n
    per_cand = {f: getattr(lp, f)[keep] for f in ("x", "job", "k", "s", "c", "cost", "energy_kwh", "renewable_kwh")}
    per_job = {f: getattr(lp, f)[:n] for f in ("u", "late_cost", "late_energy_kwh", "late_renewable_kwh", "late_start")}
    return dataclasses.replace(
        lp,
        objective_kg=float(per_cand["x"] @ per_cand["cost"] + per_job["u"] @ per_job["late_cost"]),
        **per_cand,
        **per_job,
    )


def _subset(p, idx: np.ndarray):
    """The problem restricted to jobs `idx` (per-job arrays sliced; clusters, hours and capacity unchanged)."""
    per_job = {name: getattr(p, name)[idx] for name in _PER_JOB_FIELDS}
    if p.req_other is not None:
        per_job["req_other"] = p.req_other[idx]
    if p.release_c is not None:
        per_job["release_c"] = p.release_c[idx]
    if p.pods is not None:
        per_job["pods"] = [p.pods[i] for i in idx]
    if p.speed is not None:
        per_job["speed"] = p.speed[idx]
    if p.deadline_spare is not None:
        per_job["deadline_spare"] = p.deadline_spare[idx]
    if p.run_now_dur is not None:
        per_job["run_now_dur"] = p.run_now_dur[idx]
    return dataclasses.replace(p, jobs=p.jobs.iloc[idx].reset_index(drop=True), **per_job)


def _thinned_expected(p, share: float):
    """The problem with its expected jobs thinned to `share` of them, evenly over their arrivals, each kept one
    standing for the jobs dropped beside it (GPUs, CPU, memory, power and transfer scaled by their count / kept):
    an LP that plans only that share of the backlog is as large as the share, and still sees the whole expected
    demand."""
    e = p.expected
    if e is None or not e.n_jobs or share >= 1.0:
        return p
    n = int(round(e.n_jobs * share))
    if not n:
        return dataclasses.replace(p, expected=None)
    kept = _subset(e, np.unique(np.linspace(0, e.n_jobs - 1, n).round().astype(np.int64)))
    w = e.n_jobs / kept.n_jobs
    scaled = {
        "gpu_total": np.round(kept.gpu_total * w).astype(np.int64),
        "kw": kept.kw * w,
        "transfer_kwh": kept.transfer_kwh * w,
    }
    if kept.req_other is not None:
        scaled["req_other"] = kept.req_other * w
    return dataclasses.replace(p, expected=dataclasses.replace(kept, **scaled))


def _priced(p):
    """The problem with its capacity price (kg per GPU-milli-hour, or None) added to the intensity: a job draws
    kw = gpu_total x r[c] kW at the default power limit, so price x gpu_total per hour = kw x dF / 1000 with
    dF = 1000 x price / r[c] gCO2e/kWh (exact for the default limit; approximate for capped options)."""
    if p.capacity_price is None or not p.n_jobs:
        return p
    g = p.gpu_total.astype(float)
    ok = g > 0
    if not ok.any():
        return p
    r = np.median(p.kw[ok, 0, :] / g[ok, None], axis=0)  # (C,) kW per GPU-milli
    dF = 1000.0 * np.asarray(p.capacity_price, float) / np.maximum(r, 1e-12)[None, :]
    return dataclasses.replace(p, forecast=p.forecast + dF[: p.hours])


def derated(p, factor: float):
    """The problem with (1 - factor) of each cluster's GPU capacity held back from the LP (head-room for node
    packing, which the LP's per-cluster capacity ignores); factor 1: unchanged."""
    if factor >= 1.0:
        return p
    hold = np.round((1.0 - factor) * np.asarray(p.capacity, float)).astype(np.int64)
    return dataclasses.replace(p, free=np.maximum(p.free - hold[None, :], 0))
