"""The coordinator: jobs one at a time in the policy's order; for each job every candidate is evaluated at once
(`candidates.Evaluator`), the policy turns the candidate view into a score (lower is better; the carbon-aware
policy's score is the cost), the best feasible candidate wins (ties: lowest k, then earliest s, then lowest c), its
GPU-milli are reserved over [s, s + occ), and a job that starts now is offered to the cluster's agent, whose
rejection masks that (now, cluster) candidate and sends the job to its next-best one. A job without any candidate
meeting its deadline takes the earliest-finishing feasible one (late; binding constraint "deadline"); one without
any feasible candidate in the horizon is unplaced.
"""

from __future__ import annotations

import time

import numpy as np

from scheduling.planning.candidates import BATCH_CELLS, CandidateBatch, Evaluator
from scheduling.planning.decision_records import explain_batch
from scheduling.planning.job_priority import PriorityParts, priority_parts
from scheduling.planning.outcome import PlanOutcome, empty_decisions, unplaced_reason
from scheduling.planning.problem import PlanningProblem, PriorityWeights


class Coordinator:
    """Runs a sequential policy (see `policies.SequentialPolicy`) over a problem, with optional cluster agents
    (list aligned with the problem's clusters) for the jobs that start now."""

    def __init__(
        self,
        problem: PlanningProblem,
        policy,
        agents=None,
        pods=None,
        now_hour: int | None = None,
        tentative_hours: int = 24,
    ):
        self.p = problem
        self.tentative_hours = tentative_hours
        self.policy = policy
        self.agents = agents
        self.pods = pods
        self.now_hour = now_hour

    def run(self, explain: bool = True, tentative: bool = True) -> PlanOutcome:
        t0 = time.perf_counter()
        p, policy = self.p, self.policy
        N = p.n_jobs
        ev = Evaluator(p)
        free = p.free.astype(np.int64).copy()
        free_other = p.free_other.astype(np.int64).copy() if p.free_other is not None else None
        prio = priority_parts(p, getattr(policy, "weights", PriorityWeights()))
        order = np.asarray(policy.order(p, prio), dtype=np.int64)
        policy.begin(p)
        k, s, c, cost, late, placed, reason, node, gpus, status, rejections = empty_decisions(N)
        explanations = []
        pending, pending_cells = [], 0  # decisions explained in batches (explain_batch), in decision order
        n_rej = 0
        for j in order:
            j = int(j)
            v = ev.view(j, free, ev.starts_needed(j, 24 if explain else 0), free_other)
            score = policy.score(p, j, v, ev)
            rejected = np.zeros(p.n_clusters, dtype=bool)
            while True:
                feas = v.feasible.copy()
                if rejected.any():
                    feas[:, 0, :] &= ~rejected[None, :]
                masked = np.where(feas, score, np.inf)
                flat = int(np.argmin(masked))
                is_late = False
                if not np.isfinite(masked.flat[flat]) and v.n < p.hours:
                    v = ev.view(j, free, None, free_other)  # nothing meets the deadline: whole horizon
                    score = policy.score(p, j, v, ev)
                    continue
                if not np.isfinite(masked.flat[flat]):
                    lateok = v.base_ok & v.cap_ok
                    if rejected.any():
                        lateok[:, 0, :] &= ~rejected[None, :]
                    if not lateok.any():
                        break
                    endt = np.where(lateok, v.end, np.inf)
                    best_end = endt.min()
                    cand = lateok & (endt <= best_end + 1e-9)
                    flat = int(np.argmin(np.where(cand, v.cost, np.inf)))
                    is_late = True
                kk, ss, cc = np.unravel_index(flat, masked.shape)
                kk, ss, cc = int(kk), int(ss), int(cc)
                if ss == 0 and self.agents is not None:
                    pod = self.pods[j]
                    pl = self.agents[cc].offer(pod, self.now_hour + int(v.occ[kk, cc]))
                    if pl is None:
                        rejected[cc] = True
                        rejections[j] += 1
                        n_rej += 1
                        continue
                    node[j], gpus[j], status[j] = pl.node_name, tuple(pl.gpus), "dispatched"
                else:
                    status[j] = "dispatched" if ss == 0 else "tentative"
                break
            if status[j] is None:
                reason[j] = unplaced_reason(p, j, rejections[j], now_only=False)
                continue
            k[j], s[j], c[j], cost[j], late[j], placed[j] = kk, ss, cc, v.cost[kk, ss, cc], is_late, True
            free[ss : ss + int(v.occ[kk, cc]), cc] -= p.gpu_total[j]
            if free_other is not None:
                free_other[:, ss : ss + int(v.occ[kk, cc]), cc] -= p.req_other[j][:, None]
            policy.assigned(j, cc)
            if explain:
                pending.append((v, score, kk, ss, cc, is_late, rejected))
                pending_cells += v.cost.size
                if pending_cells >= BATCH_CELLS:
                    explanations += self._explain(pending, prio, ev)
                    pending, pending_cells = [], 0
        if pending:
            explanations += self._explain(pending, prio, ev)
        t1 = time.perf_counter()
        out = PlanOutcome(
            p,
            policy.name,
            order,
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
            explanations,
        )
        if tentative and self.agents is not None:
            self._tentative(out)
        out.stats = {
            "coordinator_s": round(t1 - t0, 4),
            "tentative_s": round(time.perf_counter() - t1, 4),
            "agent_rejections": int(n_rej),
            "n_jobs": int(N),
            "n_placed": int(placed.sum()),
            "n_late": int(late.sum()),
            "horizon_h": int(p.hours),
            "n_options": int(p.n_options),
        }
        return out

    def _tentative(self, out: PlanOutcome) -> None:
        """Tentative nodes for the jobs starting within `tentative_hours` (later starts keep node None: they
        will be planned again many times before they start)."""
        p = self.p
        pos = {int(j): r for r, j in enumerate(out.order)}
        for cc, agent in enumerate(self.agents):
            js = [j for j in np.flatnonzero(out.placed & (out.c == cc) & (out.s > 0) & (out.s <= self.tentative_hours))]
            if not js:
                continue
            js.sort(key=lambda j: (out.s[j], pos[int(j)]))
            reqs = [
                (
                    self.pods[j],
                    self.now_hour + int(out.s[j]),
                    self.now_hour + int(out.s[j]) + int(np.ceil(p.dur[j, out.k[j], cc] - 1e-9)),
                )
                for j in js
            ]
            res = agent.tentative(reqs)
            for j in js:
                pl = res.get(self.pods[j].pod_id)
                if pl is not None:
                    out.node[j], out.gpus[j] = pl.node_name, tuple(pl.gpus)

    def _explain(self, items: list, prio: PriorityParts, ev) -> list[dict]:
        """Explanations of decisions [(view, score, k, s, c, late, rejected clusters)], in their order; computed in
        batches of views with like start-hour ranges (a batch is padded to its longest)."""
        by_n = sorted(range(len(items)), key=lambda i: items[i][0].n)
        out = [None] * len(items)
        lo = 0
        while lo < len(by_n):
            hi = lo + 1
            while hi < len(by_n) and items[by_n[hi]][0].n <= 1.25 * items[by_n[lo]][0].n:
                hi += 1
            group = [items[i] for i in by_n[lo:hi]]
            b, score = CandidateBatch.stack([it[0] for it in group], [it[1] for it in group])
            kk, ss, cc, late = (np.array([it[i] for it in group]) for i in (2, 3, 4, 5))
            records = explain_batch(
                self.p, self.policy.name, b, score, kk, ss, cc, late, np.array([it[6] for it in group]), prio, ev
            )
            for i, record in zip(by_n[lo:hi], records):
                out[i] = record
            lo = hi
        return out
