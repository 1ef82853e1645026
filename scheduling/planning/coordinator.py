"""The coordinator: jobs one at a time in the policy's order; for each job, every candidate (power option k,
start hour s, cluster c) is evaluated at once with numpy over the (K, H, C) tensor -- no Python loop over
candidates.

For job j with run time d[k, c] hours (fractional), occupied hours occ = ceil(d), draw kW[k, c]:

* window carbon  W[k, s, c] = S[s + floor(d), c] - S[s, c] + frac(d) * F[s + floor(d), c], with S the cumulative
  sum of the forecast F over hours (so a window costs two look-ups, whatever its length);
  cost = kW * W / 1000 (kg) + transfer kWh * (F[s, home] + F[s, c]) / 2 / 1000 when c is outside the home region;
* capacity       the window fits iff no hour in [s, s + occ) has free[h, c] < g_j (GPU-milli; and, when tracked,
  free CPU / memory below the job's request): with B the cumulative count of such hours,
  B[s + occ, c] - B[s, c] == 0. This is the sliding-window minimum of free capacity (min free >= g) for every
  window length at once, in O(H C);
* deadline       s <= floor(deadline - d[k, c]), release <= s, s + occ <= H; the cluster must host the job
  (GPU model, node shape).

The policy turns the candidate view into a score (lower is better; the carbon-aware policy's score is the
cost), the best feasible candidate wins (ties: lowest k, then earliest s, then lowest c), its GPU-milli are
reserved over [s, s + occ), and a job that starts now is offered to the cluster's agent, whose rejection masks
that (now, cluster) candidate and sends the job to its next-best one. A job without any candidate meeting its
deadline takes the earliest-finishing feasible one (late; binding constraint "deadline"); one without any
feasible candidate in the horizon is unplaced.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduling.domain.plan import ASSIGNMENT_COLUMNS, EXTRA_ASSIGNMENT_COLUMNS, Plan, empty_assignments
from scheduling.planning.problem import PlanningProblem, PriorityWeights

EPS = 1e-9
HOUR = pd.Timedelta(hours=1)


# ---------------------------------------------------------------------------------------------- priority
def range_extrema(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each query i, the max and min of values[lo[i]:hi[i]+1, :] per column (sparse tables, O(H log H C)
    to build, O(N C) to answer). values (H, C); lo, hi (N,) inclusive, lo <= hi."""
    H = values.shape[0]
    mx, mn = [values], [values]
    span = 1
    while 2 * span <= H:
        a, b = mx[-1], mn[-1]
        mx.append(np.maximum(a[:-span], a[span:]))
        mn.append(np.minimum(b[:-span], b[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    out_max = np.empty((len(lo), values.shape[1]))
    out_min = np.empty_like(out_max)
    for lv in np.unique(level):
        sel = level == lv
        w = 1 << int(lv)
        a, b = lo[sel], hi[sel] - w + 1
        out_max[sel] = np.maximum(mx[lv][a], mx[lv][b])
        out_min[sel] = np.minimum(mn[lv][a], mn[lv][b])
    return out_max, out_min


def empty_decisions(n: int) -> tuple:
    """The per-job decision arrays a plan fills in: option k, start hour s, cluster c, cost, late, placed, reason,
    node, gpus, status, rejections (-1 / NaN / False / None: not decided yet)."""
    return (np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64),
            np.full(n, np.nan), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), [None] * n, [None] * n,
            [None] * n, [None] * n, np.zeros(n, dtype=np.int64))


@dataclass
class PriorityParts:
    urgency: np.ndarray
    flexibility: np.ndarray
    opportunity: np.ndarray
    priority: np.ndarray
    weights: PriorityWeights


def priority_parts(problem: PlanningProblem, weights: PriorityWeights) -> PriorityParts:
    """U = (deadline - now) / duration, F = flexibility, O = (C_max - C_min) / C_max of the forecast over the
    job's window [release, deadline] and the clusters that can host it; P = w_U U + w_F F + w_O O."""
    N, H = problem.n_jobs, problem.hours
    if N == 0:
        z = np.zeros(0)
        return PriorityParts(z, z, z, z, weights)
    d_ref = problem.ref_duration()
    U = problem.deadline_rel / np.maximum(d_ref, EPS)
    Fx = problem.jobs["flexibility"].to_numpy(float)
    lo = np.clip(problem.release, 0, H - 1)
    hi = np.clip(np.ceil(problem.deadline_rel).astype(np.int64) - 1, 0, H - 1)
    hi = np.maximum(hi, lo)
    cmax, cmin = range_extrema(problem.forecast, lo, hi)
    allowed = problem.allowed
    cmax = np.where(allowed, cmax, -np.inf).max(axis=1)
    cmin = np.where(allowed, cmin, np.inf).min(axis=1)
    O = np.where(np.isfinite(cmax) & (cmax > 0), (cmax - cmin) / np.maximum(cmax, EPS), 0.0)
    P = weights.urgency * U + weights.flexibility * Fx + weights.opportunity * O
    return PriorityParts(U, Fx, O, P, weights)


# ---------------------------------------------------------------------------------------------- candidates
class CandidateView:
    """The (K, H, C) candidate tensor of one job: `cost` (kg, forecast), `end` (hours from now), masks
    `base_ok` (horizon, release, cluster hosts the job, option exists), `cap_ok`, `timely`, and `feasible`."""

    __slots__ = ("j", "cost", "carbon", "_end", "_run", "base_ok", "cap_ok", "timely", "feasible", "occ", "dur",
                 "trans", "s", "n", "price")

    @property
    def end(self) -> np.ndarray:
        """(K, n, C) end hour of each candidate, computed when asked (most views never are)."""
        if self._end is None:
            self._end = self.s + self._run[:, None, :]
        return self._end


class CandidateBatch:
    """The candidate tensors of jobs J together, (B, K, n, C) over the batch's longest start-hour range n; job i's
    own range is [0, ns[i]) (`views` slices it). What `explain_batch` reads."""

    __slots__ = ("J", "ns", "cost", "carbon", "base_ok", "cap_ok", "timely", "occ", "s", "price")

    @classmethod
    def stack(cls, views: list[CandidateView], scores: list[np.ndarray]) -> tuple["CandidateBatch", np.ndarray]:
        """Views of several jobs (each over its own start hours) as one batch padded to the longest range, and
        their policy scores the same way (B, K, n, C); the padding lies outside every job's range."""
        B = len(views)
        K, _, C = views[0].cost.shape
        n = max(v.n for v in views)
        b = cls()
        b.J, b.ns = np.array([v.j for v in views], dtype=np.int64), [v.n for v in views]
        b.occ, b.s, b.price, b.carbon = np.stack([v.occ for v in views]), np.arange(n)[None, :, None], None, None
        b.cost, score = np.zeros((B, K, n, C)), np.zeros((B, K, n, C))
        b.base_ok, b.cap_ok, b.timely = (np.zeros((B, K, n, C), dtype=bool) for _ in range(3))
        for i, v in enumerate(views):
            m = v.n
            b.cost[i, :, :m], score[i, :, :m] = v.cost, scores[i]
            b.base_ok[i, :, :m], b.cap_ok[i, :, :m], b.timely[i, :, :m] = v.base_ok, v.cap_ok, v.timely
        return b, score


BATCH_CELLS = 32_000  # candidate cells (jobs x options x start hours x clusters) per batch: temporaries stay in L2


class Evaluator:
    """Per-plan precomputation (cumulative forecast sums, flat index grids) and the per-job vectorized
    evaluation. Arrays over hours are padded to 2H + 2 rows (repeating the last row) so that every window index
    stays in bounds; windows that leave the horizon are masked by `base_ok`."""

    def __init__(self, problem: PlanningProblem):
        self.p = problem
        H, C = problem.hours, problem.n_clusters
        F = problem.forecast
        self.H, self.C = H, C
        pad = H + 2
        self.Fp = np.vstack([F, np.repeat(F[-1:], pad, axis=0)])  # (2H+2, C)
        self.S = np.zeros((2 * H + 3, C))
        np.cumsum(self.Fp, axis=0, out=self.S[1:])
        self.Fflat = self.Fp.ravel()
        self.Sflat = self.S.ravel()
        self.s = np.arange(H)[None, :, None]
        self.cidx = np.arange(C)[None, None, :]
        self.base_idx = self.s * C + self.cidx  # (1, H, C) flat index of (s, c)
        self.hours = np.arange(H)
        self.B = np.zeros((2 * H + 3, C), dtype=np.int32)
        self.job_ids = problem.jobs["job_id"].astype(str).tolist()
        self._iso: dict[int, str] = {}
        self._dur = np.where(np.isfinite(problem.dur), problem.dur, 0.0)
        self._finite = np.isfinite(problem.dur)
        # a run longer than the horizon counts as H + 1 hours (as one that cannot run at all): `base_ok` masks it
        # and every window index stays inside the padded arrays
        longer = ~self._finite | (self._dur > H + 1)
        self.occ_all = np.where(longer, H + 1, np.ceil(self._dur - 1e-9)).astype(np.int64)
        self.whole_all = np.where(longer, H + 1, np.floor(self._dur + 1e-9)).astype(np.int64)
        frac = np.where(longer, 0.0, self._dur - self.whole_all)
        frac[frac < 1e-9] = 0.0
        self.frac_all = frac
        self.latest_all = np.floor(problem.deadline_rel[:, None, None] - self._dur + 1e-9)
        self.host_all = problem.allowed[:, None, :] & self._finite  # (N, K, C)
        self._now = None  # `start_now`'s per-plan table
        self.Pflat = None
        if problem.capacity_price is not None:
            Pp = np.vstack([problem.capacity_price, np.zeros((pad, C))])
            P = np.zeros((2 * H + 3, C))
            np.cumsum(Pp, axis=0, out=P[1:])
            self.Pflat = P.ravel()

    def iso(self, h: int) -> str:
        text = self._iso.get(h)
        if text is None:
            text = self._iso[h] = (self.p.now + int(h) * HOUR).isoformat()
        return text

    def starts_needed(self, j: int, extra: int = 0) -> int:
        """Start hours worth evaluating for job j: up to its latest timely start (+ `extra` hours, for the
        explanation's look past the deadline), at least one past its release."""
        lat = np.where(self.host_all[j], self.latest_all[j], -1).max()
        n = int(max(lat, self.p.release[j])) + 1 + extra
        return int(min(max(n, 1), self.H))

    def start_now(self, j: int, c: int, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cost, feasible) over the power options of job j starting now on cluster c: `view(j, free, 1)`'s
        column c at hour 0 without building the view (the dispatch asks this for every job it starts). The
        capacity-free part is computed once per plan for every job."""
        if self._now is None:
            _, _, cost, timely, base_ok, _ = self.windows(np.arange(self.p.n_jobs), 1, with_end=False)
            self._now = (cost[:, :, 0, :], (timely & base_ok)[:, :, 0, :])
        cost, ok = self._now
        bad = np.zeros(self.H + 2, dtype=np.int64)  # hours short of room in [0, occ), as view's cap_ok
        np.cumsum(free[:, c] < self.p.gpu_total[j], out=bad[1: self.H + 1])
        bad[self.H + 1] = bad[self.H]
        return cost[j, :, c], ok[j, :, c] & (bad[self.occ_all[j, :, c]] == 0)

    def windows(self, J: np.ndarray, n: int, clusters: np.ndarray | None = None, with_end: bool = True):
        """The capacity-free part of the candidate tensors of jobs J over start hours [0, n), batched over jobs (a
        leading axis): occ (B, K, C) hours held; carbon, cost (B, K, n, C) kg with the forecast (cost adds the data
        transfer of a move); timely, base_ok masks; end (hours from now; None without `with_end`). `clusters`
        (ascending indices): only those columns, as if C were that list (for jobs that cannot run elsewhere).
        `view` is one job of it; callers over every job (`optimum._candidates`) take it in chunks, without a
        Python step per job."""
        p = self.p
        H, C = self.H, self.C
        occ, whole, frac, kw = self.occ_all[J], self.whole_all[J], self.frac_all[J], p.kw[J]
        latest, host, base = self.latest_all[J], self.host_all[J], self.base_idx[:, :n]
        if clusters is not None:
            occ, whole, frac, kw, latest, host = (a[:, :, clusters] for a in (occ, whole, frac, kw, latest, host))
            base = base[:, :, clusters]
        s = self.s[:, :n]
        iw = base + (whole * C)[:, :, None, :]
        W = self.Sflat[iw] - self.Sflat[base] + frac[:, :, None, :] * self.Fflat[iw]
        carbon = W * (kw / 1000.0)[:, :, None, :]
        cs = slice(None) if clusters is None else clusters
        tk = p.transfer_kwh[J][:, cs]  # (B, C)
        if tk.any():
            h = p.home[J]
            Fh = p.forecast[:n, np.maximum(h, 0)].T  # (B, n) the home region's intensity
            if (h < 0).any():  # not in this fleet: the fleet's mean
                Fh[h < 0] = p.forecast[:n].mean(axis=1)
            cost = carbon + (tk[:, None, :] * 0.5 / 1000.0 * (Fh[:, :, None] + p.forecast[None, :n, cs]))[:, None]
        else:
            cost = carbon
        # masks as one comparison each against a per-(job, option, cluster) threshold (these arrays are the bulk of
        # a plan's candidate work): timely = s <= latest start, and with `postpone_margin_h` a start after now
        # must leave that many hours before it (a fallback); base_ok = s <= H - occ where the cluster hosts the
        # job (else never), and s >= release
        latest = latest[:, :, None, :]
        if p.postpone_margin_h > 0:
            timely = s <= latest - p.postpone_margin_h
            timely[:, :, 0] = (latest >= 0)[:, :, 0]  # starting now needs no fallback hour
        else:
            timely = s <= latest
        base_ok = s <= np.where(host, H - occ, -1)[:, :, None, :]
        release = p.release[J]
        if release.any():
            base_ok &= s >= release[:, None, None, None]
        if p.release_c is not None:  # per cluster: no node can take the job before then (multi-GPU drains)
            base_ok &= s >= p.release_c[J][:, cs][:, None, None, :]
        end = s + self._dur[J][:, :, cs][:, :, None, :] if with_end else None
        return occ, carbon, cost, timely, base_ok, end

    def view(self, j: int, free: np.ndarray | None, n_starts: int | None = None,
             free_other: np.ndarray | None = None) -> CandidateView:
        """The candidate tensor of job j over start hours [0, n_starts) (default: the whole horizon); `free`
        None: capacity is not checked (every window has room)."""
        # a slice, not [j]: the batch arrays are then views of the per-plan arrays, not copies
        return self.views(slice(j, j + 1), free, [self.H if n_starts is None else int(n_starts)], free_other)[0]

    def each_batch(self, J: np.ndarray, free: np.ndarray | None, n_starts, free_other: np.ndarray | None = None):
        """`batch` over any number of jobs, in pieces of about BATCH_CELLS cells (bounded temporaries), in the
        order of J."""
        K, C = self.p.dur.shape[1], self.C
        i = 0
        while i < len(J):
            cells, e = 0, i
            while e < len(J) and (e == i or cells + K * int(n_starts[e]) * C <= BATCH_CELLS):
                cells += K * int(n_starts[e]) * C
                e += 1
            yield self.batch(J[i:e], free, n_starts[i:e], free_other)
            i = e

    def views(self, J: np.ndarray, free: np.ndarray | None, n_starts, free_other: np.ndarray | None = None
              ) -> list[CandidateView]:
        """`view` of each job of J (its own start hours [0, n_starts[i])) on the same capacity `free`."""
        return self.views_of(self.batch(J, free, n_starts, free_other))

    def views_of(self, b: CandidateBatch) -> list[CandidateView]:
        p = self.p
        out = []
        for i, j in enumerate(b.J):
            m = b.ns[i]
            v = CandidateView()
            v.j, v.occ, v.dur, v.trans, v.n = int(j), b.occ[i], p.dur[j], None, m
            v.cost, v.carbon, v._end, v._run = b.cost[i, :, :m], b.carbon[i, :, :m], None, self._dur[j]
            v.base_ok, v.cap_ok, v.timely = b.base_ok[i, :, :m], b.cap_ok[i, :, :m], b.timely[i, :, :m]
            v.s = self.s[:, :m]
            v.price = None if b.price is None else b.price[i, :, :m]
            v.feasible = v.base_ok & v.cap_ok & v.timely
            out.append(v)
        return out

    def batch(self, J: np.ndarray, free: np.ndarray | None, n_starts, free_other: np.ndarray | None = None
              ) -> CandidateBatch:
        """The candidate tensors of jobs J on the same capacity `free`, computed together over the batch's longest
        start-hour range (every array is elementwise in the start hour, so each job's view is a slice of it). For
        the explanations of a whole plan: one batch instead of a view per job."""
        p = self.p
        H, C = self.H, self.C
        ns = [int(x) for x in n_starts]
        n, B = max(ns), len(ns)
        Jarr = np.arange(J.start, J.stop) if isinstance(J, slice) else np.asarray(J, dtype=np.int64)
        occ, carbon, cost, timely, base_ok, _ = self.windows(J, n, with_end=False)
        base = self.base_idx[:, :n]
        end_idx = base + (occ * C)[:, :, None, :]  # (B, K, n, C)
        if free is None:
            cap_ok = np.ones(end_idx.shape, dtype=bool)
        else:  # capacity: count of hours with too little free capacity inside the window, per job
            bad = free[None] < p.gpu_total[J][:, None, None]  # (B, H, C)
            if free_other is not None:
                for i, j in enumerate(Jarr):
                    req = p.req_other[j]
                    for r in range(len(req)):
                        if req[r]:
                            bad[i] |= free_other[r] < req[r]
            rows = 2 * H + 3
            if B == 1:  # (the coordinator's view per job: the plan's buffer)
                np.cumsum(bad[0], axis=0, out=self.B[1: H + 1])
                self.B[H + 1:] = self.B[H]
                Bf = self.B.ravel()
                cap_ok = Bf[end_idx] == Bf[base]
            else:
                Bc = np.zeros((B, rows, C), dtype=np.int32)
                np.cumsum(bad, axis=1, out=Bc[:, 1: H + 1])
                Bc[:, H + 1:] = Bc[:, H: H + 1]
                Bf = Bc.ravel()
                off = (np.arange(B) * rows * C)[:, None, None, None]
                cap_ok = Bf[end_idx + off] == Bf[base + off]
        b = CandidateBatch()
        b.J, b.ns, b.occ, b.s = Jarr, ns, occ, self.s[:, :n]
        b.cost, b.carbon, b.base_ok, b.cap_ok, b.timely = cost, carbon, base_ok, cap_ok, timely
        b.price = None
        if self.Pflat is not None:
            b.price = (self.Pflat[end_idx] - self.Pflat[base]) * p.gpu_total[J].astype(float)[:, None, None, None]
        return b


# ---------------------------------------------------------------------------------------------- outcome
@dataclass
class PlanOutcome:
    """What one plan decided, as arrays over the problem's jobs (index j), plus explanations."""

    problem: PlanningProblem
    policy: str
    order: np.ndarray
    k: np.ndarray
    s: np.ndarray
    c: np.ndarray
    cost: np.ndarray
    late: np.ndarray
    placed: np.ndarray
    reason: list
    node: list
    gpus: list
    status: list
    rejections: np.ndarray
    priority: PriorityParts
    explanations: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    # running jobs this plan preempts (`PlacementPolicy.preemption`): [(job id, cluster index, the job id it made
    # room for, or "carbon" when stopped to resume somewhere cleaner)]
    evicted: list = field(default_factory=list)

    def energy_kwh(self) -> np.ndarray:
        p = self.problem
        j = np.arange(p.n_jobs)
        kk, cc = np.maximum(self.k, 0), np.maximum(self.c, 0)
        e = p.kw[j, kk, cc] * p.dur[j, kk, cc] + p.transfer_kwh[j, cc]
        return np.where(self.placed, e, 0.0)

    def to_plan(self) -> Plan:
        p = self.problem
        jobs = p.jobs
        sel = np.flatnonzero(self.placed)
        if len(sel):
            kk, ss, cc = self.k[sel], self.s[sel], self.c[sel]
            dur = p.dur[sel, kk, cc]
            start = p.now + pd.to_timedelta(ss, unit="h")
            a = pd.DataFrame({
                "job_id": jobs["job_id"].to_numpy()[sel],
                "cluster": np.array(p.clusters, dtype=object)[cc],
                "region": np.array(p.regions, dtype=object)[cc],
                "node": [self.node[i] for i in sel],
                "gpu_devices": [",".join(str(g) for g in self.gpus[i]) if self.gpus[i] is not None else None
                                for i in sel],
                "gpu_milli": jobs["gpu_milli"].to_numpy(np.int64)[sel],
                "gpu_count": jobs["num_gpu"].to_numpy(np.int64)[sel],
                "start_time": start,
                "end_time": start + pd.to_timedelta(dur, unit="h"),
                "power_limit_w": p.limit_w[kk, cc],
                "expected_energy_kwh": p.kw[sel, kk, cc] * dur + p.transfer_kwh[sel, cc],
                "expected_kgco2e": self.cost[sel],
                "priority": self.priority.priority[sel],
                "zone": np.array(p.zones, dtype=object)[cc],
                "gpu_model": np.array(p.gpu_models, dtype=object)[cc],
                "status": [self.status[i] for i in sel],
                "submit_time": pd.to_datetime(jobs["submit_time"].to_numpy()[sel], utc=True),
                "deadline": pd.to_datetime(jobs["deadline"].to_numpy()[sel], utc=True),
                "cpu_milli": jobs["cpu_milli"].to_numpy(np.int64)[sel],
                "memory_mib": jobs["memory_mib"].to_numpy(np.int64)[sel],
                "workload_class": jobs["workload_class"].to_numpy()[sel],
                "checkpointing": jobs["checkpointing"].to_numpy(bool)[sel],
                "late": self.late[sel],
            })
            a = a[list(ASSIGNMENT_COLUMNS + EXTRA_ASSIGNMENT_COLUMNS)]
        else:
            a = empty_assignments()
        un = np.flatnonzero(~self.placed)
        unplaced = pd.DataFrame({"job_id": jobs["job_id"].to_numpy()[un].astype(object),
                                 "reason": [self.reason[i] for i in un]})
        return Plan(plan_time=p.now, policy=self.policy, forecast_version=p.forecast_version, assignments=a,
                    explanations=self.explanations, unplaced=unplaced, stats=dict(self.stats))


# ---------------------------------------------------------------------------------------------- the loop
class Coordinator:
    """Runs a sequential policy (see `policies.SequentialPolicy`) over a problem, with optional cluster agents
    (list aligned with the problem's clusters) for the jobs that start now."""

    def __init__(self, problem: PlanningProblem, policy, agents=None, pods=None, now_hour: int | None = None,
                 tentative_hours: int = 24):
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
                any_host = p.allowed[j].any()
                reason[j] = ("no_hostable_cluster" if not any_host else
                             "rejected_by_agents" if rejections[j] else "no_capacity_in_horizon")
                continue
            k[j], s[j], c[j], cost[j], late[j], placed[j] = kk, ss, cc, v.cost[kk, ss, cc], is_late, True
            free[ss: ss + int(v.occ[kk, cc]), cc] -= p.gpu_total[j]
            if free_other is not None:
                free_other[:, ss: ss + int(v.occ[kk, cc]), cc] -= p.req_other[j][:, None]
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
        out = PlanOutcome(p, policy.name, order, k, s, c, cost, late, placed, reason, node, gpus, status, rejections,
                          prio, explanations)
        if tentative and self.agents is not None:
            self._tentative(out)
        out.stats = {"coordinator_s": round(t1 - t0, 4), "tentative_s": round(time.perf_counter() - t1, 4),
                     "agent_rejections": int(n_rej), "n_jobs": int(N), "n_placed": int(placed.sum()),
                     "n_late": int(late.sum()), "horizon_h": int(p.hours), "n_options": int(p.n_options)}
        return out

    def _tentative(self, out: PlanOutcome) -> None:
        """Tentative nodes for the jobs starting within `tentative_hours` (later starts keep node None: they
        will be planned again many times before they start)."""
        p = self.p
        pos = {int(j): r for r, j in enumerate(out.order)}
        for cc, agent in enumerate(self.agents):
            js = [j for j in np.flatnonzero(out.placed & (out.c == cc) & (out.s > 0)
                                            & (out.s <= self.tentative_hours))]
            if not js:
                continue
            js.sort(key=lambda j: (out.s[j], pos[int(j)]))
            reqs = [(self.pods[j], self.now_hour + int(out.s[j]),
                     self.now_hour + int(out.s[j]) + int(np.ceil(p.dur[j, out.k[j], cc] - 1e-9))) for j in js]
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
            records = explain_batch(self.p, self.policy.name, b, score, kk, ss, cc, late,
                                    np.array([it[6] for it in group]), prio, ev)
            for i, record in zip(by_n[lo:hi], records):
                out[i] = record
            lo = hi
        return out


def explain_choice(p: PlanningProblem, policy_name: str, j: int, v: CandidateView, score: np.ndarray, kk: int,
                   ss: int, cc: int, is_late: bool, rejected: np.ndarray, prio: PriorityParts, ev: Evaluator,
                   optimum_kg: float | None = None) -> dict:
    """The explanation of one decision: `explain_batch` of a batch of one."""
    b, sc = CandidateBatch.stack([v], [score])
    return explain_batch(p, policy_name, b, sc, np.array([kk]), np.array([ss]), np.array([cc]), np.array([is_late]),
                         np.asarray(rejected)[None], prio, ev, None if optimum_kg is None else np.array([optimum_kg]))[0]


def explain_batch(p: PlanningProblem, policy_name: str, b: CandidateBatch, score: np.ndarray, kk: np.ndarray,
                  ss: np.ndarray, cc: np.ndarray, is_late: np.ndarray, rejected: np.ndarray, prio: PriorityParts,
                  ev: Evaluator, optimum_kg: np.ndarray | None = None) -> list[dict]:
    """The explanations (EXPLANATION_KEYS) of the decisions on the jobs of batch `b` (job i at option kk[i], start
    ss[i], cluster cc[i]; `score` (B, K, n, C) the policy's own score, `rejected` (B, C) the clusters whose agent
    refused it): priority and its parts, the top five alternatives by forecast carbon (ties by start hour, then
    cluster), counterfactuals (run now at home, greedy-carbon, and `optimum_kg` where the policy has the LP's
    value), binding constraints judged on the policy's own score, forecast version, power limit. Each job sees only
    its own start hours [0, b.ns[i]). The arithmetic runs over the batch at once; only the records are built per
    job."""
    H, C = p.hours, p.n_clusters
    J = b.J
    B = len(J)
    rows = np.arange(B)
    valid = b.s < np.asarray(b.ns)[:, None, None, None]  # (B, 1, n, 1): the job's own start hours
    feasible = b.base_ok & b.cap_ok & b.timely & valid
    fc = np.where(feasible, b.cost, np.inf)
    chosen_cost = b.cost[rows, kk, ss, cc]
    best_default = fc[:, 0].min(axis=(1, 2))
    per_sc = fc.min(axis=1)  # (B, n, C) best option per (start, cluster)
    per_sc[rows, ss, cc] = np.inf
    flat = per_sc.reshape(B, -1)
    # the five cheapest per job: every cell up to the fifth-smallest value (ties included), by value then index
    L = flat.shape[1]
    fifth = np.partition(flat, 4, axis=1)[:, 4] if L > 5 else np.full(B, np.inf)
    r_idx, c_idx = np.nonzero((flat <= fifth[:, None]) & np.isfinite(flat))
    vals = flat[r_idx, c_idx]
    o = np.lexsort((c_idx, vals, r_idx))
    r_idx, c_idx, vals = r_idx[o], c_idx[o], vals[o]
    first = np.searchsorted(r_idx, rows)
    last = np.minimum(np.searchsorted(r_idx, rows, side="right"), first + 5)
    # counterfactuals at the default power limit, capacity ignored: run at release at home; greedy-carbon
    r = np.clip(p.release[J], 0, H - 1).astype(np.int64)
    ok0 = b.base_ok[rows, 0, r]  # (B, C)
    has_ok = ok0.any(axis=1)
    home = p.home[J].astype(np.int64)
    home_ok = (home >= 0) & ok0[rows, np.maximum(home, 0)]
    fastest = np.argmin(np.where(ok0, p.dur[J, 0], np.inf), axis=1)
    home = np.where(home_ok, home, np.where(has_ok, fastest, -1))
    run_now = b.cost[rows, 0, r, np.maximum(home, 0)]
    greedy_c = b.cost[rows, 0, r, np.argmin(np.where(ok0, p.forecast[r], np.inf), axis=1)]
    # binding constraints, judged on the policy's own score
    chosen_score = score[rows, kk, ss, cc]
    tol = 1e-9 + 1e-9 * np.abs(chosen_score)

    def cheaper(mask):
        return np.where(mask & valid, score, np.inf).min(axis=(1, 2, 3)) < chosen_score - tol

    capacity = rejected.any(axis=1) | cheaper(b.base_ok & b.timely & ~b.cap_ok)
    deadline = np.asarray(is_late, dtype=bool) | cheaper(b.base_ok & b.cap_ok & ~b.timely)
    host_no = ~p.allowed[J]  # (B, C)
    gpu_model = np.zeros(B, dtype=bool)
    if host_no.any():
        fin = np.isfinite(p.dur[J]) & host_no[:, None, :]  # (B, K, C)
        m = ((b.s <= (H - b.occ)[:, :, None, :]) & (b.s >= p.release[J][:, None, None, None])
             & fin[:, :, None, :] & b.cap_ok & b.timely)
        gpu_model = host_no.any(axis=1) & cheaper(m)
    weights = prio.weights.as_dict()
    out = []
    for i in range(B):
        j, k_i, s_i, c_i = int(J[i]), int(kk[i]), int(ss[i]), int(cc[i])
        alts = []
        for t in range(first[i], last[i]):
            hs, hc = divmod(int(c_idx[t]), C)
            alts.append({"region": p.regions[hc], "cluster": p.clusters[hc],
                         "start_time": ev.iso(hs), "kgco2e": round(float(vals[t]), 6)})
        binding = [name for name, on in (("capacity", capacity[i]), ("deadline", deadline[i]),
                                         ("gpu_model", gpu_model[i])) if on] or ["none"]
        saving = best_default[i] - chosen_cost[i] if np.isfinite(best_default[i]) else None
        out.append({
            "job_id": ev.job_ids[j],
            "priority": float(prio.priority[j]),
            "urgency": float(prio.urgency[j]),
            "flexibility": float(prio.flexibility[j]),
            "opportunity": float(prio.opportunity[j]),
            "weights": dict(weights),
            "chosen": {"region": p.regions[c_i], "cluster": p.clusters[c_i], "zone": p.zones[c_i],
                       "start_time": ev.iso(s_i), "kgco2e": round(float(chosen_cost[i]), 6),
                       "late": bool(is_late[i])},
            "alternatives": alts,
            "counterfactuals": {"run_now_kgco2e": round(float(run_now[i]), 6) if home[i] >= 0 else None,
                                "greedy_carbon_kgco2e": round(float(greedy_c[i]), 6) if has_ok[i] else None,
                                "optimum_kgco2e": None if optimum_kg is None else round(float(optimum_kg[i]), 6)},
            "binding_constraints": binding,
            "forecast_version": p.forecast_version,
            "power": {"limit_w": float(p.limit_w[k_i, c_i]),
                      "saving_kgco2e": None if saving is None else round(max(float(saving), 0.0), 6)},
            "policy": policy_name,
            "agent_rejections": [p.clusters[x] for x in np.flatnonzero(rejected[i])],
        })
    return out
