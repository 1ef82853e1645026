"""Every candidate (power option k, start hour s, cluster c) of a job, evaluated at once with numpy over the (K, H, C)
tensor -- no Python loop over candidates.

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

A run longer than the horizon (occ > H) may start at any hour of the horizon and end after it (`last_start`), so
that it is planned, not left without candidates. Past the horizon, its window's intensity is the forecast's last day
repeated (`past_horizon`: the same hour of day), and its capacity is that of the horizon's last hour: every
commitment a plan knows of is a running job, which holds its resources from now until its end, so a window with
room up to the horizon has room after it too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scheduling.planning.problem import PlanningProblem

EPS = 1e-9
HOUR = pd.Timedelta(hours=1)


class CandidateView:
    """The (K, H, C) candidate tensor of one job: `cost` (kg, forecast), `end` (hours from now), masks
    `base_ok` (horizon, release, cluster hosts the job, option exists), `cap_ok`, `timely`, and `feasible`."""

    __slots__ = (
        "j",
        "cost",
        "carbon",
        "_end",
        "_run",
        "base_ok",
        "cap_ok",
        "timely",
        "feasible",
        "occ",
        "dur",
        "trans",
        "s",
        "n",
        "price",
    )

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
    def stack(cls, views: list[CandidateView], scores: list[np.ndarray]) -> tuple[CandidateBatch, np.ndarray]:
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


def last_start(occ: np.ndarray, H: int) -> np.ndarray:
    """The last start hour of a run of `occ` whole hours in a horizon of H hours: one that ends by the horizon's
    end, or, for a run longer than the horizon, its last hour."""
    return np.where(occ > H, H - 1, H - occ)


def past_horizon(A: np.ndarray, rows: int) -> np.ndarray:
    """The hourly array A (H, ...) followed by `rows` more hours: its last day (24 hours, all of it when shorter)
    repeated, each hour at the same hour of day. The intensity (and renewable share) a plan assumes after its
    forecast ends."""
    H = A.shape[0]
    day = min(24, H)
    return np.concatenate([A, A[H - day + np.arange(int(rows)) % day]], axis=0)


def _deadline_dur(problem: PlanningProblem, dur: np.ndarray) -> np.ndarray:
    """(N, K, C) the hours a start must leave before the planning deadline: the run time on the job's fastest
    cluster at the default limit; at a slower limit max(run time, run time x option_margin - deadline_spare), on a
    slower cluster at the default limit the same with cluster_margin, so that a run that long still ends by the
    job's own deadline."""
    if problem.option_margin <= 1.0 and problem.cluster_margin <= 1.0:
        return dur
    spare = 0.0 if problem.deadline_spare is None else np.asarray(problem.deadline_spare, float)[:, None, None]
    out = dur.copy()
    out[:, 1:, :] = np.maximum(dur[:, 1:, :], problem.option_margin * dur[:, 1:, :] - spare)
    if problem.cluster_margin > 1.0:
        at_max = dur[:, :1, :]
        hosted = np.isfinite(problem.dur[:, :1, :]) & problem.allowed[:, None, :]
        fastest = np.where(hosted, at_max, np.inf).min(axis=2, keepdims=True, initial=np.inf)
        slower = at_max > fastest + 1e-9
        out[:, :1, :] = np.where(slower, np.maximum(at_max, problem.cluster_margin * at_max - spare), at_max)
    return out


def latest_all(problem: PlanningProblem, dur: np.ndarray) -> np.ndarray:
    """(N, K, C) each option's latest timely start, in whole hours from now (`dur`: run times, 0 where none)."""
    return np.floor(problem.deadline_rel[:, None, None] - _deadline_dur(problem, dur) + 1e-9)


def due_now(problem: PlanningProblem) -> np.ndarray:
    """(N,) the released jobs whose latest timely start over the options and clusters that host them is now."""
    finite = np.isfinite(problem.dur)
    host = problem.allowed[:, None, :] & finite
    latest = np.where(host, latest_all(problem, np.where(finite, problem.dur, 0.0)), -1).max(axis=(1, 2), initial=-1)
    return (np.asarray(problem.release) <= 0) & (latest == 0)


BATCH_CELLS = 32_000  # candidate cells (jobs x options x start hours x clusters) per batch: temporaries stay in L2


class Evaluator:
    """Per-plan precomputation (cumulative forecast sums, flat index grids) and the per-job vectorized
    evaluation. The forecast continues past the horizon (`past_horizon`) for as long as the longest run a cluster
    hosts, so that every window index stays in bounds; capacity is looked up to the horizon's end, past which it is
    the horizon's last hour (the module doc): the capacity arrays have 2H + 3 rows."""

    def __init__(self, problem: PlanningProblem):
        self.p = problem
        H, C = problem.hours, problem.n_clusters
        F = problem.forecast
        self.H, self.C = H, C
        self._dur = np.where(np.isfinite(problem.dur), problem.dur, 0.0)
        self._finite = np.isfinite(problem.dur)
        hosted = problem.allowed[:, None, :] & self._finite
        longest = int(np.ceil(np.where(hosted, self._dur, 0.0).max() - 1e-9)) if self._dur.size else 0
        pad = max(H, longest) + 2  # hours after the horizon a window may reach
        self.Fp = past_horizon(F, pad)  # (H + pad, C)
        self.rows = H + pad + 1  # rows of the cumulative arrays over hours
        self.S = np.zeros((self.rows, C))
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
        # an option that cannot run, or a longer one than any hosted run of the plan (on a cluster that does not
        # host the job), counts as H + 1 hours: `base_ok` masks it, and its indexes stay in bounds
        never = ~self._finite | (self._dur > pad - 2)
        self.occ_all = np.where(never, H + 1, np.ceil(self._dur - 1e-9)).astype(np.int64)
        self.whole_all = np.where(never, H + 1, np.floor(self._dur + 1e-9)).astype(np.int64)
        frac = np.where(never, 0.0, self._dur - self.whole_all)
        frac[frac < 1e-9] = 0.0
        self.frac_all = frac
        self.latest_all = latest_all(problem, self._dur)
        self.host_all = problem.allowed[:, None, :] & self._finite  # (N, K, C)
        self._now = None  # `start_now`'s per-plan table
        self.Pflat = None
        if problem.capacity_price is not None:
            Pp = np.vstack([problem.capacity_price, np.zeros((pad, C))])
            P = np.zeros((self.rows, C))
            np.cumsum(Pp, axis=0, out=P[1:])
            self.Pflat = P.ravel()

    def iso(self, h: int) -> str:
        text = self._iso.get(h)
        if text is None:
            text = self._iso[h] = (self.p.now + int(h) * HOUR).isoformat()
        return text

    def latest_start(self, j: int) -> int:
        """Job j's latest timely start (hours from now) over the options and clusters that host it; -1: none."""
        return int(np.where(self.host_all[j], self.latest_all[j], -1).max())

    def starts_needed(self, j: int, extra: int = 0) -> int:
        """Start hours worth evaluating for job j: up to its latest timely start (+ `extra` hours, for the
        explanation's look past the deadline), at least one past its release."""
        n = max(self.latest_start(j), int(self.p.release[j])) + 1 + extra
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
        np.cumsum(free[:, c] < self.p.gpu_total[j], out=bad[1 : self.H + 1])
        bad[self.H + 1] = bad[self.H]
        return cost[j, :, c], ok[j, :, c] & (bad[np.minimum(self.occ_all[j, :, c], self.H + 1)] == 0)

    def windows(self, J: np.ndarray, n: int, clusters: np.ndarray | None = None, with_end: bool = True):
        """The capacity-free part of the candidate tensors of jobs J over start hours [0, n), batched over jobs (a
        leading axis): occ (B, K, C) hours held; carbon, cost (B, K, n, C) kg with the forecast (cost adds the data
        transfer of a move); timely, base_ok masks; end (hours from now; None without `with_end`). `clusters`
        (ascending indices): only those columns, as if C were that list (for jobs that cannot run elsewhere).
        `view` is one job of it; callers over every job (`optimum._candidates`) take it in chunks, without a
        Python step per job."""
        p = self.p
        C = self.C
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
        # must leave that many hours before it (a fallback); base_ok = s <= last_start(occ) where the cluster
        # hosts the job (else never), and s >= release
        latest = latest[:, :, None, :]
        if p.postpone_margin_h > 0:
            timely = s <= latest - p.postpone_margin_h
            timely[:, :, 0] = (latest >= 0)[:, :, 0]  # starting now needs no fallback hour
        else:
            timely = s <= latest
        base_ok = s <= np.where(host, last_start(occ, self.H), -1)[:, :, None, :]
        release = p.release[J]
        if release.any():
            base_ok &= s >= release[:, None, None, None]
        if p.release_c is not None:  # per cluster: no node can take the job before then (multi-GPU drains)
            base_ok &= s >= p.release_c[J][:, cs][:, None, None, :]
        end = s + self._dur[J][:, :, cs][:, :, None, :] if with_end else None
        return occ, carbon, cost, timely, base_ok, end

    def view(
        self, j: int, free: np.ndarray | None, n_starts: int | None = None, free_other: np.ndarray | None = None
    ) -> CandidateView:
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

    def views(
        self, J: np.ndarray, free: np.ndarray | None, n_starts, free_other: np.ndarray | None = None
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

    def batch(
        self, J: np.ndarray, free: np.ndarray | None, n_starts, free_other: np.ndarray | None = None
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
        end_idx = base + (np.minimum(occ, H + 1) * C)[:, :, None, :]  # (B, K, n, C) up to the horizon's end
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
                np.cumsum(bad[0], axis=0, out=self.B[1 : H + 1])
                self.B[H + 1 :] = self.B[H]
                Bf = self.B.ravel()
                cap_ok = Bf[end_idx] == Bf[base]
            else:
                Bc = np.zeros((B, rows, C), dtype=np.int32)
                np.cumsum(bad, axis=1, out=Bc[:, 1 : H + 1])
                Bc[:, H + 1 :] = Bc[:, H : H + 1]
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
