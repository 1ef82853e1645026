"""The offline optimum: a linear-programming relaxation over jobs x (power option, start hour, cluster).

Variables x[j, k, s, c] in [0, 1] for every candidate that meets the job's release, deadline, horizon and hosting
constraints (the candidate set the coordinator evaluates), and one late variable u[j] in [0, 1] per job.
Constraints, as sparse matrices (scipy.sparse, solved by HiGHS through highspy, `_solve_highs`):

* each job runs once:            sum_{k,s,c} x[j,k,s,c] + u[j] = 1
* capacity per cluster and hour: sum_{j,k,s: s <= h < s + occ[j,k,c]} g_j x[j,k,s,c] <= free[h, c]   (GPU-milli;
                                 with `resources="all"` also CPU milli-cores and memory MiB), for the hours h < H
                                 (a run may end after the horizon: `candidates`)

Objective: the carbon of each candidate (energy x the intensity of the hours it runs, plus data transfer) -- for
the bound, the *actual* intensity (perfect knowledge) and every job of the trace known from the start. u[j]
stands for running job j late: it costs the cheapest late candidate of the job (capacity ignored) plus a penalty
(`late_penalty_kg`, so that lateness is used only where no timely schedule exists); the reported value counts the
carbon only.

Why it is a bound: for any schedule, setting x to its timely jobs and u = 1 for its late ones satisfies the
constraints (late jobs are left out of the capacity rows) and costs at most the schedule's carbon. The LP drops
integrality, node packing (capacity is aggregated per cluster) and the capacity used by late jobs, so its carbon
is a lower bound for every schedule that runs no more jobs late than the LP does (`late_job_share`, 0 when all
deadlines can be met) -- whatever the policy and whatever it knew.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from scheduling.planning.candidates import BATCH_CELLS, Evaluator, past_horizon
from scheduling.planning.problem import PlanningProblem, abs_hours

CAPACITY_CHUNK = 20_000  # candidates per chunk while the capacity matrix is built (bounds its index temporaries)
_MILP_STATUS = {0: "optimal", 1: "iteration_or_time_limit", 2: "infeasible", 3: "unbounded", 4: "numerical"}


@dataclass
class HighsSolution:
    status: str  # optimal, iteration_or_time_limit, infeasible, unbounded, numerical
    x: np.ndarray | None  # None unless optimal (as scipy's linprog)
    ineq_duals: np.ndarray | None  # row duals of A_ub (<= 0 for a binding capacity row, as linprog's marginals)
    basis: tuple[np.ndarray, np.ndarray] | None = None  # (column, row) statuses (HighsBasisStatus values), if asked
    iterations: int = 0  # simplex iterations


class WarmStart:
    """Carries the simplex basis of one solved LP to the next, related one -- the rolling planner's LP of the next
    hour, which shares most of its jobs, candidates and capacity rows -- so that HiGHS starts from it instead of
    from scratch. Columns and rows are matched by what they stand for (job id, power option, absolute start hour
    and cluster; capacity row by absolute hour and cluster; a job's row by its id): new columns start at 0, new rows
    with their slack basic; HiGHS completes the rest ("alien" basis). The optimum is the same, in fewer simplex
    iterations; where it is not unique (a degenerate LP), a warm start may return another optimal vertex than a cold
    one, which moves a simulated run as any small change to an hourly policy does. Where the LP changes a lot from
    one hour to the next it saves nothing. Opt-in (`scheduling.evaluation.ablations.WarmStarted`): the hourly plan
    solves cold."""

    HOUR_BITS, CLUSTER_BITS, LATE_K = 20, 8, 15

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.origin: int | None = None  # keys count hours from here (the first planning hour seen)
        self.last_now = 0
        self.last: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.solves = self.warm_solves = self.iterations = 0

    def keys(
        self, problem: PlanningProblem, job, k, s, c, keep: np.ndarray, R: int, hourly_rows: int | None, block_h: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(column keys, row keys) in `solve_lp`'s layout; None where the problem cannot be keyed (then cold)."""
        now = int(abs_hours(problem.now))
        if self.origin is None or now < self.last_now:  # a replay that goes back in time starts afresh
            self.origin, self.last = now, None
        self.last_now = now
        rel = now - self.origin
        H, C = problem.hours, problem.n_clusters
        if C >= 1 << self.CLUSTER_BITS or rel + H >= 1 << self.HOUR_BITS or problem.n_options >= self.LATE_K:
            return None
        ids = problem.jobs["job_id"].astype(str).tolist()
        code = np.fromiter((self.codes.setdefault(i, len(self.codes)) for i in ids), np.int64, len(ids))
        hb, cb = self.HOUR_BITS, self.CLUSTER_BITS

        def col_key(j_code, kk, hour, cc):
            return (((j_code * 16 + kk) << hb | hour) << cb) | cc

        cols = np.concatenate([col_key(code[job], k, rel + s, c), col_key(code, self.LATE_K, 0, 0)])
        h_rows = len(keep) // (R * C)
        i = np.flatnonzero(keep)
        r, hc = np.divmod(i, h_rows * C)
        h, cc = np.divmod(hc, C)
        blocked = R == 1 and hourly_rows is not None and hourly_rows < H
        # an hourly row is keyed by its absolute hour; a block row by its place in the horizon (the b-th block
        # ahead): blocks move with the planning hour, and the next hour's b-th block overlaps this one's in 5 of 6
        # hours (keyed by absolute start, none would match: 250 instead of 370 iterations with the place)
        kind = (h >= hourly_rows).astype(np.int64) if blocked else np.zeros_like(h)
        when = np.where(kind == 1, h - (hourly_rows or 0), rel + h)
        rows = np.concatenate([(((r * 2 + kind) << hb | when) << cb) | cc, -(code + 1)])
        return cols, rows

    def start(self, cols: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The previous basis carried over to these columns and rows (None: nothing to carry)."""
        if self.last is None:
            return None
        old_cols, old_col_status, old_rows, old_row_status = self.last
        return _carry(cols, old_cols, old_col_status, 0), _carry(rows, old_rows, old_row_status, 1)

    def remember(self, cols, rows, res: HighsSolution, warm: bool) -> None:
        self.solves += 1
        self.warm_solves += int(warm)
        self.iterations += res.iterations
        self.last = None if res.basis is None else (cols, res.basis[0], rows, res.basis[1])


def _carry(new_keys: np.ndarray, old_keys: np.ndarray, old_status: np.ndarray, default: int) -> np.ndarray:
    """Status of each new key: the old key's where it existed, else `default` (0: at its lower bound, 1: basic)."""
    out = np.full(len(new_keys), default, dtype=np.int8)
    if not len(old_keys) or not len(new_keys):
        return out
    order = np.argsort(old_keys, kind="stable")
    pos = np.minimum(np.searchsorted(old_keys, new_keys, sorter=order), len(old_keys) - 1)
    hit = old_keys[order[pos]] == new_keys
    out[hit] = old_status[order[pos[hit]]]
    return out


def _solve_highs(
    obj: np.ndarray,
    A_ub,
    b_ub: np.ndarray,
    A_eq,
    b_eq: np.ndarray,
    time_limit_s: float,
    presolve: bool = True,
    basis: tuple[np.ndarray, np.ndarray] | None = None,
    want_basis: bool = False,
) -> HighsSolution:
    """min obj @ x, A_ub x <= b_ub, A_eq x = b_eq, 0 <= x <= 1, by HiGHS through highspy: the model goes in as
    arrays (A_ub column-wise or row-wise as given, A_eq added row-wise). scipy's `linprog` runs the same HiGHS
    (pinned alike: identical solutions and duals) but converts the matrices first and loops over every column in
    Python after the solve, a large share of a rolling plan's time. `basis`: a simplex start (`WarmStart`);
    `want_basis`: return the final basis too."""
    n = len(obj)
    A_ub = A_ub if getattr(A_ub, "format", None) in ("csc", "csr") else sparse.csr_matrix(A_ub)
    A_eq = sparse.csr_matrix(A_eq)
    m = A_ub.shape[0]
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731 -- HighsInt
    f64 = lambda a: np.ascontiguousarray(a, dtype=float)  # noqa: E731
    fmt = highspy.MatrixFormat.kColwise if A_ub.format == "csc" else highspy.MatrixFormat.kRowwise
    h = highspy._Highs()  # the bare solver: highspy.Highs() prints a banner on stdout (JSON commands use stdout)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("presolve", "on" if presolve else "off")
    h.passModel(
        n,
        m,
        int(A_ub.nnz),
        int(fmt),
        int(highspy.ObjSense.kMinimize),
        0.0,
        f64(obj),
        np.zeros(n),
        np.ones(n),
        np.full(m, -highspy.kHighsInf),
        f64(b_ub),
        i32(A_ub.indptr),
        i32(A_ub.indices),
        f64(A_ub.data),
        np.zeros(n, dtype=np.int32),
    )
    h.addRows(
        A_eq.shape[0], f64(b_eq), f64(b_eq), int(A_eq.nnz), i32(A_eq.indptr[:-1]), i32(A_eq.indices), f64(A_eq.data)
    )
    if basis is not None:  # a start for the simplex (HiGHS then skips presolve); "alien": any count of basics
        lut = list(highspy.HighsBasisStatus.__members__.values())
        start = highspy.HighsBasis()
        start.col_status = [lut[v] for v in basis[0].tolist()]
        start.row_status = [lut[v] for v in basis[1].tolist()]
        start.alien = True
        h.setBasis(start)
    h.run()
    ms = h.getModelStatus()
    M = highspy.HighsModelStatus
    if ms == M.kModelEmpty:  # no jobs: nothing to decide
        return HighsSolution("optimal", np.zeros(n), np.zeros(m))
    status = {
        M.kOptimal: "optimal",
        M.kTimeLimit: "iteration_or_time_limit",
        M.kIterationLimit: "iteration_or_time_limit",
        M.kInfeasible: "infeasible",
        M.kUnbounded: "unbounded",
        M.kUnboundedOrInfeasible: "unbounded",
    }.get(ms, "numerical")
    if status != "optimal":
        return HighsSolution(status, None, None)
    sol = h.getSolution()
    final = None
    if want_basis:
        b = h.getBasis()
        final = (np.fromiter(map(int, b.col_status), np.int8, n), np.fromiter(map(int, b.row_status), np.int8))
    return HighsSolution(
        status, np.asarray(sol.col_value), np.asarray(sol.row_dual)[:m], final, int(h.getInfo().simplex_iteration_count)
    )


@dataclass
class LPResult:
    status: str
    objective_kg: float  # carbon only: timely candidates + the late jobs' cheapest late runs (no penalty)
    x: np.ndarray  # per candidate
    job: np.ndarray  # candidates come job by job (ascending job index)
    k: np.ndarray
    s: np.ndarray
    c: np.ndarray
    cost: np.ndarray
    energy_kwh: np.ndarray
    renewable_kwh: np.ndarray
    u: np.ndarray  # (N,) share of each job run late
    late_cost: np.ndarray  # (N,) cheapest late run (kg)
    late_energy_kwh: np.ndarray
    late_renewable_kwh: np.ndarray
    late_start: np.ndarray  # (N,) start hour of that late run (-1: none in the horizon)
    n_vars: int
    n_rows: int
    nnz: int
    solve_s: float
    build_s: float
    iterations: int = 0  # HiGHS simplex iterations (0 for the MILP)
    power_reduction: str = (
        "none"  # how power options were reduced for size (`max_candidates`): none | default | cheapest
    )
    duals: np.ndarray | None = None  # (R, H, C) capacity shadow prices, kgCO2e per unit-hour (GPU-milli, ...)

    @property
    def default_power_only(self) -> bool:
        """Only the default power limit was kept (`power_reduction="default"` on a large model)."""
        return self.power_reduction == "default"

    @property
    def late_job_share(self) -> float:
        return float(self.u.mean()) if len(self.u) else 0.0

    def per_job(self, n: int, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.job, weights=self.x * values, minlength=n)

    def job_carbon(self, n: int) -> np.ndarray:
        """(n,) each job's carbon in the solution: its timely candidates by weight plus its late share."""
        return self.per_job(n, self.cost) + self.u * self.late_cost

    def heaviest(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per job, its candidate with the largest weight (ties: the first candidate): (weight, k, s, c), weight -1
        and -1 indexes for a job without candidates. The rounding of the fractional solution to one plan."""
        weight = np.full(n, -1.0)
        k, s, c = (np.full(n, -1, dtype=np.int64) for _ in range(3))
        if len(self.job):
            order = np.lexsort((-np.arange(len(self.job)), self.x, self.job))
            last = order[np.r_[self.job[order][1:] != self.job[order][:-1], True]]
            j = self.job[last]
            weight[j], k[j], s[j], c[j] = self.x[last], self.k[last], self.s[last], self.c[last]
        return weight, k, s, c

    def summary(self) -> dict:
        return {
            "status": self.status,
            "objective_kgco2e": self.objective_kg,
            "n_vars": self.n_vars,
            "n_rows": self.n_rows,
            "nnz": self.nnz,
            "build_s": round(self.build_s, 3),
            "solve_s": round(self.solve_s, 3),
            "late_job_share": self.late_job_share,
            "default_power_only": self.default_power_only,
            "power_reduction": self.power_reduction,
        }


def held_in_horizon(problem: PlanningProblem, job, k, s, c) -> np.ndarray:
    """Whole hours candidates (job, k, s, c) hold their cluster within the horizon: the run's hours up to the
    horizon's end (a run may end after it; capacity there is the horizon's last hour's, `candidates`)."""
    occ = np.ceil(problem.dur[job, k, c] - 1e-9).astype(np.int64)
    return np.minimum(occ, problem.hours - np.asarray(s, dtype=np.int64))


def _candidates(problem: PlanningProblem):
    """Timely candidates of every job (capacity ignored) and each job's cheapest late run. Jobs in batches
    (`Evaluator.windows`) of about `BATCH_CELLS` cells, no Python step per job; a batch holds jobs that can run on
    the same clusters (most jobs: every cluster with a GPU model they accept) and evaluates only those columns."""
    ev = Evaluator(problem)
    N, H = problem.n_jobs, problem.hours
    K = problem.dur.shape[1]
    fits = problem.gpu_total[:, None] <= problem.free.max(axis=0)[None, :]  # (N, C)
    usable = ev.host_all.any(axis=1) & fits  # (N, C): clusters where job j has any candidate
    pattern = np.packbits(usable, axis=1)
    groups = np.unique(pattern, axis=0, return_inverse=True)[1].reshape(-1)
    J, K_, S, C_, cost = [], [], [], [], []
    late_cost = np.full(N, np.nan)
    late_pick = np.full((N, 3), -1, dtype=np.int64)
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        cs = np.flatnonzero(usable[members[0]])
        if not len(cs):
            continue
        step = max(1, BATCH_CELLS // (K * H * len(cs)))
        for lo in range(0, len(members), step):
            jb = members[lo : lo + step]
            _, _, cb, timely, ok, _ = ev.windows(jb, H, cs, with_end=False)  # on cs every job fits
            b, kk, ss, cc = np.nonzero(ok & timely)  # C order: job by job, then (k, s, c) as the LP lays them out
            J.append(jb[b]), K_.append(kk), S.append(ss), C_.append(cs[cc])
            cost.append(cb[b, kk, ss, cc])
            late = (ok > timely).reshape(len(jb), -1)  # ok and not timely
            has = np.flatnonzero(late.any(axis=1))
            if len(has):
                lc = np.where(late, cb.reshape(len(jb), -1), np.inf)
                flat = lc.argmin(axis=1)[has]  # the first minimum in (k, s, c) order, as over every cluster
                late_cost[jb[has]] = lc[has, flat]
                lk, ls, lcc = np.unravel_index(flat, (K, H, len(cs)))
                late_pick[jb[has]] = np.column_stack([lk, ls, cs[lcc]])
    if not J:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z, np.zeros(0), late_cost, late_pick
    job = np.concatenate(J)
    order = np.argsort(job, kind="stable")  # groups interleave jobs; within a job the (k, s, c) order stays
    cat = lambda parts: np.concatenate(parts)[order]  # noqa: E731
    return job[order], cat(K_), cat(S), cat(C_), cat(cost), late_cost, late_pick


def candidates(problem: PlanningProblem):
    """(job, k, s, c, carbon, late_cost, late_pick) of every timely candidate and each job's cheapest late run, as
    `solve_lp` builds its columns: for models that refine the same candidates (the node-aware optimum)."""
    return _candidates(problem)


def assignment(job, n_jobs: int, cost, late_cost, late_penalty_kg: float):
    """(A_eq, objective, late cost per job) of "each job once": its columns plus its late variable u sum to 1; the
    columns cost their carbon, u the job's cheapest late run in the horizon (0 when there is none: a run after the
    horizon costs at least that, so a bound stays valid) plus `late_penalty_kg`. Columns first, then u."""
    n = len(job)
    A_eq = sparse.csr_matrix(
        (np.ones(n + n_jobs), (np.concatenate([job, np.arange(n_jobs)]), np.arange(n + n_jobs))),
        shape=(n_jobs, n + n_jobs),
    )
    lb_late = np.where(np.isfinite(late_cost), late_cost, 0.0)
    return A_eq, np.concatenate([cost, lb_late + late_penalty_kg]), lb_late


def solve_binary(obj, A_ub, b_ub, A_eq, options: dict):
    """HiGHS branch and bound (scipy `milp`) over binary variables: min obj x, A_ub x <= b_ub, A_eq x = 1."""
    return milp(
        obj,
        integrality=np.ones(len(obj)),
        bounds=Bounds(0, 1),
        constraints=[LinearConstraint(A_ub, -np.inf, b_ub), LinearConstraint(A_eq, 1, 1)],
        options=options,
    )


def _energy(problem: PlanningProblem, job, k, s, c):
    """Energy (kWh) and renewable energy (kWh, with the problem's renewable shares) of candidates."""
    d = problem.dur[job, k, c]
    kw = problem.kw[job, k, c]
    tk = problem.transfer_kwh[job, c]
    energy = kw * d + tk
    R = problem.renewable
    if R is None or not len(job):
        return energy, np.zeros_like(energy)
    C = problem.n_clusters
    whole = np.floor(d + 1e-9).astype(np.int64)
    Rp = past_horizon(R, int(whole.max()) + 2)
    SR = np.zeros((Rp.shape[0] + 1, C))
    np.cumsum(Rp, axis=0, out=SR[1:])
    frac = d - whole
    frac[frac < 1e-9] = 0.0
    iw = s + whole
    wr = SR[iw, c] - SR[s, c] + frac * Rp[iw, c]
    h = problem.home[job]
    rh = np.where(h >= 0, R[s, np.maximum(h, 0)], R[s, c])
    return energy, kw * wr + tk * 0.5 * (rh + R[s, c])


def _capacity_rows(
    problem: PlanningProblem,
    job,
    k,
    s,
    c,
    resources: str,
    hourly_rows: int | None,
    block_h: int,
    chunk: int = CAPACITY_CHUNK,
):
    """The capacity rows of `solve_lp` as a sparse matrix over [candidates, late variables], their bounds, the mask
    of the (resource, hour, cluster) rows kept (those some candidate touches) and the number of resources. A function
    of its own so that its index temporaries are freed before the solver runs; with one resource they are built
    `chunk` candidates at a time, so the solve's peak memory is the matrix and HiGHS's copies of it."""
    N, H, C = problem.n_jobs, problem.hours, problem.n_clusters
    n = len(job)
    occ = held_in_horizon(problem, job, k, s, c)
    coefs = [problem.gpu_total.astype(float)]
    bounds = [problem.free.astype(float).reshape(-1)]
    if resources == "all" and problem.free_other is not None:
        for r in range(problem.free_other.shape[0]):
            coefs.append(problem.req_other[:, r].astype(float))
            bounds.append(problem.free_other[r].astype(float).reshape(-1))
    R = len(coefs)
    b_ub = np.concatenate(bounds)
    blocked = R == 1 and hourly_rows is not None and hourly_rows < H
    if R > 1:
        # capacity rows: for candidate v, rows (h, c) with h in [s, s + occ)
        total = int(occ.sum())
        var = np.repeat(np.arange(n), occ)
        first = np.repeat(np.cumsum(occ) - occ, occ)
        rows = (s[var] + (np.arange(total) - first)) * C + c[var]
    if R == 1:
        # column-major already (candidate by candidate, rows ascending): build the CSC matrix HiGHS takes
        # directly, only over the rows some candidate touches (a CSR/COO round trip costs as much as the solve)
        if blocked:
            # row r < hourly_rows: hour r; row hourly_rows + b: hours [hourly_rows + b*block_h, + block_h), holding
            # the block's mean. A candidate [s, e) has its hourly rows, then every block it overlaps, weighted by
            # the hours of overlap / block length -- computed per candidate, without expanding its hours.
            hr, bh = int(hourly_rows), int(block_h)
            n_blocks = hr + -(-(H - hr) // bh)
            length = np.where(
                np.arange(n_blocks) < hr, 1, np.minimum(bh, H - hr - (np.arange(n_blocks) - hr) * bh)
            ).astype(float)
            e = s + occ
            n_hourly = np.clip(np.minimum(e, hr) - s, 0, None)
            b_lo = (np.maximum(s, hr) - hr) // bh
            n_block = np.where(e > hr, (e - 1 - hr) // bh - b_lo + 1, 0)
            counts = n_hourly + n_block

            def entries(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
                """(row, value) of candidates [lo, hi), candidate by candidate, rows ascending."""
                cnt = counts[lo:hi]
                var = lo + np.repeat(np.arange(hi - lo), cnt)
                t = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                in_hours = t < n_hourly[var]
                b = b_lo[var] + (t - n_hourly[var])
                lo_h = np.maximum(s[var], hr + b * bh)
                hi_h = np.minimum(e[var], hr + (b + 1) * bh)
                row_hour = np.where(in_hours, s[var] + t, hr + b)
                weight = np.where(in_hours, 1.0, (hi_h - lo_h) / length[np.minimum(row_hour, n_blocks - 1)])
                return row_hour * C + c[var], coefs[0][job[var]] * weight

            hb = np.where(np.arange(H) < hr, np.arange(H), hr + (np.arange(H) - hr) // bh)
            fb = np.zeros((n_blocks, C))
            np.add.at(fb, hb, problem.free.astype(float))
            b_ub = (fb / length[:, None]).reshape(-1)
            H_rows = n_blocks
        else:
            counts = occ

            def entries(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
                cnt = occ[lo:hi]
                var = lo + np.repeat(np.arange(hi - lo), cnt)
                first = np.repeat(np.cumsum(cnt) - cnt, cnt)
                return (s[var] + (np.arange(int(cnt.sum())) - first)) * C + c[var], np.repeat(coefs[0][job[lo:hi]], cnt)

            H_rows = H
        # two passes over chunks of candidates (which rows are used, then the entries): the index temporaries
        # stay chunk-sized instead of several arrays of the matrix's size
        chunks = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)] or [(0, 0)]
        used = np.zeros(H_rows * C, dtype=bool)
        for lo, hi in chunks:
            used[entries(lo, hi)[0]] = True
        keep = used
        remap = np.cumsum(used) - 1
        nnz = int(counts.sum())
        index_type = np.int32 if nnz < 2**31 - 1 and H_rows * C < 2**31 - 1 else np.int64  # HiGHS takes int32
        indptr = np.concatenate([[0], np.cumsum(counts), np.full(N, nnz)]).astype(index_type)
        indices = np.empty(nnz, dtype=index_type)
        vals = np.empty(nnz, dtype=float)
        for lo, hi in chunks:
            rows, values = entries(lo, hi)
            indices[indptr[lo] : indptr[hi]] = remap[rows]
            vals[indptr[lo] : indptr[hi]] = values
        A_ub = sparse.csc_matrix((vals, indices, indptr), shape=(int(used.sum()), n + N))
        b_ub = b_ub[keep]
    else:
        A_ub = sparse.csr_matrix(
            (
                np.concatenate([np.repeat(co[job], occ) for co in coefs]),
                (np.concatenate([rows + r * H * C for r in range(R)]), np.tile(var, R)),
            ),
            shape=(R * H * C, n + N),
        )
        keep = np.asarray(A_ub.getnnz(axis=1) > 0)
        A_ub, b_ub = A_ub[keep], b_ub[keep]
    return A_ub, b_ub, keep, R


def solve_lp(
    problem: PlanningProblem,
    late_penalty_kg: float = 1000.0,
    time_limit_s: float = 600.0,
    resources: str = "gpu",
    integral: bool = False,
    hourly_rows: int | None = None,
    block_h: int = 6,
    max_candidates: int | None = None,
    presolve: bool = True,
    power_reduction: str = "cheapest",
    warm: WarmStart | None = None,
) -> LPResult:
    """Solve the relaxation on `problem` (its `forecast` is the intensity the bound assumes). `resources`:
    "gpu" (GPU-milli capacity rows) or "all" (also CPU and memory, where the problem tracks them).
    `integral=True` solves the same model with binary x and u (HiGHS branch and bound, time-limited; no duals):
    the integral optimum of the aggregated-capacity model, to measure the relaxation's gap on small instances.
    `hourly_rows` (GPU rows only; None: every hour): capacity rows are hourly for that many hours, then one row per
    `block_h` hours holding the block's mean (a weaker constraint with far fewer non-zeros, for the rolling
    planner, which commits only hour 0 and plans the rest again; never for the bound). `max_candidates` (None:
    no limit): above that many candidates the power options are reduced to one per (job, start hour, cluster),
    which bounds the solve time of the rolling planner's largest plans -- `power_reduction="cheapest"` (default)
    keeps the option with the least carbon there (a deadline-meeting one: only timely candidates exist),
    `"default"` the default limit (`default_power_only`). Either way the model has the K = 1 model's size; the
    cheapest option keeps the carbon the LP weighs closer to the full model's. `presolve=False` skips HiGHS's
    presolve (on the rolling planner's models the solve is then faster, with the same optimum).
    `warm` (a `WarmStart`, LP only): start the simplex from the basis of the LP it solved last, and keep this one's."""
    t0 = time.perf_counter()
    N, H, C = problem.n_jobs, problem.hours, problem.n_clusters
    job, k, s, c, cost, late_cost, late_pick = _candidates(problem)
    reduce = max_candidates is not None and len(job) > max_candidates and bool((k > 0).any())
    if power_reduction not in ("cheapest", "default"):
        raise ValueError(f"power_reduction must be 'cheapest' or 'default', not {power_reduction!r}")
    if reduce:
        if power_reduction == "default":  # the K = 1 model: its candidates are exactly those at the default limit
            keep_v = k == 0
        else:  # per (job, start, cluster) the least-carbon option (candidates come job by job, so stay sorted)
            key = (job * H + s) * C + c
            order = np.lexsort((k, cost, key))
            first_of_key = np.r_[True, key[order][1:] != key[order][:-1]]
            keep_v = np.zeros(len(job), dtype=bool)
            keep_v[order[first_of_key]] = True
        job, k, s, c, cost = job[keep_v], k[keep_v], s[keep_v], c[keep_v], cost[keep_v]
    n = len(job)
    A_ub, b_ub, keep, R = _capacity_rows(problem, job, k, s, c, resources, hourly_rows, block_h)
    A_eq, obj, lb_late = assignment(job, N, cost, late_cost, late_penalty_kg)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if integral:
        res = solve_binary(obj, A_ub, b_ub, A_eq, {"time_limit": time_limit_s, "presolve": presolve})
        # a time-limited branch and bound may still return its best integral solution
        res = HighsSolution(_MILP_STATUS.get(res.status, str(res.status)), res.x, None)
    else:
        keys = warm.keys(problem, job, k, s, c, keep, R, hourly_rows, block_h) if warm is not None else None
        start = warm.start(*keys) if keys is not None else None
        res = _solve_highs(
            obj, A_ub, b_ub, A_eq, np.ones(N), time_limit_s, presolve, basis=start, want_basis=keys is not None
        )
        if keys is not None:
            warm.remember(*keys, res, start is not None)
    solve_s = time.perf_counter() - t1
    sol = np.clip(res.x, 0.0, 1.0) if res.x is not None else np.zeros(n + N)
    x, u = sol[:n], sol[n:]
    duals = np.zeros(R * H * C)
    marg = res.ineq_duals
    if marg is not None and len(marg) == int(keep.sum()) and len(keep) == len(duals):
        duals[np.flatnonzero(keep)] = -np.asarray(marg)
    energy, ren = _energy(problem, job, k, s, c)
    lk, ls, lc = late_pick[:, 0], late_pick[:, 1], late_pick[:, 2]
    has = lk >= 0
    le, lr = np.zeros(N), np.zeros(N)
    if has.any():
        e2, r2 = _energy(problem, np.flatnonzero(has), lk[has], ls[has], lc[has])
        le[has], lr[has] = e2, r2
    return LPResult(
        status=res.status,
        objective_kg=float(x @ cost + u @ lb_late),
        x=x,
        job=job,
        k=k,
        s=s,
        c=c,
        cost=cost,
        energy_kwh=energy,
        renewable_kwh=ren,
        u=u,
        late_cost=lb_late,
        late_energy_kwh=le,
        late_renewable_kwh=lr,
        late_start=np.where(has, ls, -1),
        iterations=res.iterations,
        power_reduction=power_reduction if reduce else "none",
        n_vars=n + N,
        n_rows=int(A_ub.shape[0] + N),
        nnz=int(A_ub.nnz + A_eq.nnz),
        solve_s=solve_s,
        build_s=build_s,
        duals=duals.reshape(R, H, C),
    )


@dataclass
class PreemptiveBound:
    """`solve_preemptive_lp`'s result: the bound when the `preemptible` jobs may stop and resume (checkpoints)."""

    status: str
    objective_kg: float  # carbon only, as LPResult.objective_kg
    late_job_share: float
    n_preemptible: int
    n_vars: int
    n_rows: int
    solve_s: float
    build_s: float

    def summary(self) -> dict:
        return {
            "status": self.status,
            "objective_kgco2e": self.objective_kg,
            "late_job_share": self.late_job_share,
            "n_preemptible": self.n_preemptible,
            "n_vars": self.n_vars,
            "n_rows": self.n_rows,
            "build_s": round(self.build_s, 3),
            "solve_s": round(self.solve_s, 3),
        }


def _hourly_work_candidates(problem: PlanningProblem, jobs: np.ndarray):
    """Per preemptible job, one variable per (power option, hour, cluster) it may run in: hours from its release
    to its deadline (rounded up), clusters and options that host it (the GPU model and node shapes allow it, the
    option exists, the job fits the cluster's GPUs). Returns (job, k, h, c, cost of a full hour in kg, work per
    hour = 1 / run time). The data transfer of a move is charged per unit of work at the cheapest hour of the window
    (a lower bound on its carbon, wherever the pieces run)."""
    H = problem.hours
    F = problem.forecast
    fits = problem.gpu_total[:, None] <= problem.free.max(axis=0)[None, :]
    out = {key: [] for key in ("j", "k", "h", "c", "cost", "work")}
    for j in jobs:
        hosts = problem.allowed[j][None, :] & np.isfinite(problem.dur[j]) & fits[j][None, :]  # (K, C)
        hours = np.arange(int(problem.release[j]), int(min(np.ceil(problem.deadline_rel[j] - 1e-9), H)))
        kk, cc = np.nonzero(hosts)
        if not len(kk) or not len(hours):
            continue
        K_, C_ = np.repeat(kk, len(hours)), np.repeat(cc, len(hours))
        H_ = np.tile(hours, len(kk))
        d = problem.dur[j, K_, C_]
        home = int(problem.home[j])
        f_home = F[hours, home] if home >= 0 else F[hours].min(axis=1)
        cheapest_move = (0.5 * (f_home[:, None] + F[hours])).min(axis=0)  # (C,) g/kWh
        cost = (problem.kw[j, K_, C_] * F[H_, C_] + problem.transfer_kwh[j, C_] / d * cheapest_move[C_]) / 1000.0
        for key, val in zip(out, (np.full(len(K_), j), K_, H_, C_, cost, 1.0 / d)):
            out[key].append(val)
    if not out["j"]:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z, np.zeros(0), np.zeros(0)
    return tuple(np.concatenate(out[key]) for key in out)


def solve_preemptive_lp(
    problem: PlanningProblem, preemptible: np.ndarray, late_penalty_kg: float = 1000.0, time_limit_s: float = 600.0
) -> PreemptiveBound:
    """The relaxation of `solve_lp` (GPU rows, every hour) where the jobs flagged `preemptible` (checkpointing) may
    run in pieces: per such job, variables y[j, k, h, c] in [0, 1] (the share of hour h it runs on cluster c at
    option k), doing y / run time of its work; its work must sum to 1 (or the job runs late, as in `solve_lp`), and
    it runs at most one hour per hour (sum over k, c of y[j, k, h, c] <= 1). The other jobs keep their whole-run
    candidates. A bound for every schedule that may also preempt and resume the flagged jobs (checkpoint and restart
    costs ignored), so below `solve_lp`'s: the gap is the most that preempting them could save."""
    t0 = time.perf_counter()
    N, H, C = problem.n_jobs, problem.hours, problem.n_clusters
    preemptible = np.asarray(preemptible, dtype=bool)
    job, k, s, c, cost, late_cost, _ = _candidates(problem)
    whole = ~preemptible[job]
    job, k, s, c, cost = job[whole], k[whole], s[whole], c[whole], cost[whole]
    yj, yk, yh, yc, ycost, ywork = _hourly_work_candidates(problem, np.flatnonzero(preemptible))
    n1, n2 = len(job), len(yj)
    occ = held_in_horizon(problem, job, k, s, c)
    var = np.repeat(np.arange(n1), occ)
    first = np.repeat(np.cumsum(occ) - occ, occ)
    rows = np.concatenate([(s[var] + (np.arange(int(occ.sum())) - first)) * C + c[var], yh * C + yc])
    cols = np.concatenate([var, n1 + np.arange(n2)])
    g = problem.gpu_total.astype(float)
    capacity = sparse.csr_matrix((np.concatenate([g[job][var], g[yj]]), (rows, cols)), shape=(H * C, n1 + n2 + N))
    slot, slot_row = np.unique(yj * H + yh, return_inverse=True)
    one_hour = sparse.csr_matrix((np.ones(n2), (slot_row, n1 + np.arange(n2))), shape=(len(slot), n1 + n2 + N))
    A_ub = sparse.vstack([capacity, one_hour]).tocsr()
    b_ub = np.concatenate([problem.free.astype(float).reshape(-1), np.ones(len(slot))])
    used = np.asarray(A_ub.getnnz(axis=1) > 0)
    A_ub, b_ub = A_ub[used], b_ub[used]
    A_eq = sparse.csr_matrix(
        (
            np.concatenate([np.ones(n1), ywork, np.ones(N)]),
            (np.concatenate([job, yj, np.arange(N)]), np.arange(n1 + n2 + N)),
        ),
        shape=(N, n1 + n2 + N),
    )
    lb_late = np.where(np.isfinite(late_cost), late_cost, 0.0)
    obj = np.concatenate([cost, ycost, lb_late + late_penalty_kg])
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = _solve_highs(obj, A_ub, b_ub, A_eq, np.ones(N), time_limit_s)
    sol = np.clip(res.x, 0.0, 1.0) if res.x is not None else np.zeros(n1 + n2 + N)
    u = sol[n1 + n2 :]
    return PreemptiveBound(
        status=res.status,
        objective_kg=float(sol[:n1] @ cost + sol[n1 : n1 + n2] @ ycost + u @ lb_late),
        late_job_share=float(u.mean()) if N else 0.0,
        n_preemptible=int(preemptible.sum()),
        n_vars=n1 + n2 + N,
        n_rows=int(A_ub.shape[0] + N),
        solve_s=time.perf_counter() - t1,
        build_s=build_s,
    )
