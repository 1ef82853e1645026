"""Every hour, the progress of each running job and the GPU power limit it runs at next (`recap_running`).

Progress (`scheduling.domain.execution`): a run's work is its planned run time at its dispatch limit, in hours at
the GPU's maximum limit (`work_h` = planned hours / the dispatch limit's time factor); the limits it ran at since
its start give the work done, the run-time error quantile the work left.

Run-time error (`RunTimeError`): actual / planned run time is lognormal, fitted on the runs finished before now
(the refiner's observations; with fewer than `min_runs`, median 1 and a 0.9-quantile of 1 + `fallback_reserve`).
A run that has done the share `r` of its planned work is still going, so its ratio is taken given that it exceeds
`r`: work left at quantile q = `work_h * ratio(q | > r) - done` (at least `min_left` of `work_h`), which grows
for a run that overran instead of vanishing. A job is planned at the highest quantile of `QUANTILES` at which
some limit still ends it by its deadline, and says which.

The limit for the next hour is the first of the cheapest pair (limit for the next hour, limit for the rest) whose
end at that quantile keeps the deadline: kgCO2e = draw (kW, PUE) x the forecast intensity integrated over the
hours it runs at each. A change is made when the current limit no longer keeps the deadline (`at_risk`: the
cheapest pair with a faster limit for the rest that keeps it, that limit from now or after one more hour at the
current one, which is then no change yet; else the fastest limit) or, for carbon, when the
changed run still ends by its deadline at the `carbon_quantile` (p99), the change saves at least `min_saving` of
the rest of the run's forecast carbon, the last change is `min_dwell_h` old and the run has changed fewer than
`max_changes` times. Its counterfactual is the limit kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from common.timeutil import utc
from scheduling.domain.execution import Segment, resume_segments, work_done_h

QUANTILES = (0.99, 0.95, 0.9, 0.75, 0.5)
RECAP_COLUMNS = (
    "job_id",
    "plan_id",  # the run's (its dispatch plan)
    "attempt",
    "cluster",
    "deadline",
    "from_limit_w",
    "to_limit_w",
    "time_factor",  # run time at to_limit_w relative to the dispatch limit (what `replay` advances at)
    "draw_kw",  # the job's draw at to_limit_w, PUE included (what the ledger values the stretch at)
    "changed",
    "reason",  # at_risk | carbon | keep | no_options (at_risk and carbon act only where `changed`)
    "quantile",  # the run-time quantile the end is planned at
    "work_h",  # the run's planned work, hours at the maximum limit
    "work_done_h",
    "work_left_h",  # at `quantile`
    "projected_end",  # at `quantile`, at the chosen limit
    "projected_end_kept",  # at `quantile`, the limit kept
    "expected_end",  # at the median, at the chosen limit: how long the run holds its GPUs
    "kgco2e",  # the rest of the run at the chosen limit(s), forecast intensity
    "kgco2e_kept",
)


@dataclass(frozen=True)
class Recapping:
    """Settings of the hourly power-limit decisions (see the module doc)."""

    min_saving: float = 0.03
    carbon_quantile: float = 0.99
    top_quantile: float = 0.99  # the highest run-time quantile a run is planned at
    option_quantile: float = 0.99  # pending jobs: slower limits only where a run this long still fits
    cluster_quantile: float = 0.9  # pending jobs: clusters slower than their fastest only where this one fits
    reserve_quantile: float = 0.9  # pending jobs: the deadline reserve is at least this quantile's overrun
    min_dwell_h: float = 2.0
    max_changes: int = 6
    min_left: float = 0.05
    min_runs: int = 20
    fallback_reserve: float = 0.2
    enabled: bool = True


@dataclass(frozen=True)
class RunTimeError:
    """A run's actual / planned run time as a lognormal: log-mean `mu` and log-spread `sigma`, fitted on `runs`
    finished runs (the refiner's observations)."""

    mu: float = 0.0
    sigma: float = 0.15
    runs: int = 0

    @classmethod
    def fit(cls, ratios, settings: Recapping = Recapping()) -> RunTimeError:
        """From the ratios of finished runs; with fewer than `settings.min_runs`, median 1 and the spread that puts
        the 0.9-quantile at 1 + `fallback_reserve`."""
        r = np.asarray(ratios, dtype=float)
        r = r[np.isfinite(r) & (r > 0)]
        if len(r) < settings.min_runs:
            return cls(0.0, float(np.log1p(settings.fallback_reserve) / _NORMAL.inv_cdf(0.9)), int(len(r)))
        logs = np.log(r)
        return cls(float(logs.mean()), float(max(logs.std(ddof=1), 1e-3)), int(len(r)))

    def ratios(self, q: float, at_least: np.ndarray) -> np.ndarray:
        """`ratio` for many runs at once."""
        a = np.asarray(at_least, dtype=float)
        z = (np.log(np.where(a > 0, a, 1.0)) - self.mu) / self.sigma
        lo = np.where(a > 0, ndtr(z), 0.0)
        u = np.minimum(lo + q * (1.0 - lo), 1.0 - 1e-9)
        return np.exp(self.mu + self.sigma * ndtri(u))

    def ratio(self, q: float, at_least: float = 0.0) -> float:
        """The q-quantile of the ratio given that it exceeds `at_least` (a run still going after doing that share of
        its planned work): F^-1(F(a) + q (1 - F(a)))."""
        lo = _NORMAL.cdf((np.log(at_least) - self.mu) / self.sigma) if at_least > 0 else 0.0
        u = min(lo + q * (1.0 - lo), 1.0 - 1e-9)
        return float(np.exp(self.mu + self.sigma * _NORMAL.inv_cdf(u)))


_NORMAL = NormalDist()


class Cumulatives:
    """∫ intensity dt from hour 0 to t per cluster, for hourly series (H, C); the last hour's value holds beyond."""

    def __init__(self, ci: np.ndarray):
        self.ci = np.asarray(ci, dtype=float).T  # (C, H)
        self.cum = np.concatenate([np.zeros((self.ci.shape[0], 1)), np.cumsum(self.ci, axis=1)], axis=1)
        self.n = self.ci.shape[1]

    def to(self, c: np.ndarray, t: np.ndarray) -> np.ndarray:
        """At times `t` ((N,) or (N, P)) of runs on clusters `c` (N,)."""
        t = np.asarray(t, dtype=float)
        cc = c if t.ndim == 1 else c[:, None]
        inside = np.clip(t, 0.0, self.n)
        hour = np.minimum(inside.astype(np.int64), self.n - 1)
        last = self.ci[cc, self.n - 1]
        return self.cum[cc, hour] + (inside - hour) * self.ci[cc, hour] + np.maximum(t - self.n, 0.0) * last


def recap_running(
    runs: pd.DataFrame,
    fleet,
    options: tuple[np.ndarray, np.ndarray, np.ndarray],
    forecast: np.ndarray,
    now,
    errors: RunTimeError,
    settings: Recapping = Recapping(),
) -> pd.DataFrame:
    """One RECAP_COLUMNS row per running job of `runs` (columns job_id, plan_id, attempt, cluster, num_gpu,
    gpu_milli, start_time, planned_start, planned_end, dispatch_limit_w, power_limit_w (in force now), deadline,
    changes: [(time, limit_w), ...] before now; optional restore_h: hours a resumed run reads its checkpoint back
    first (neither work nor progress); optional recap: False where the executor cannot change a limit,
    whose run is then only projected); `options`: the (K, C) time factors, average power per GPU (W) and limits
    (W) of `option_arrays`; `forecast` (H, C) g/kWh per cluster from `now`. Every run is decided at once (numpy over
    runs x option pairs: a loop hour follows thousands)."""
    now = utc(now)
    if runs is None or runs.empty:
        return pd.DataFrame(columns=list(RECAP_COLUMNS))
    names = {n: i for i, n in enumerate(fleet.names)}
    runs = runs[runs["cluster"].isin(names)].reset_index(drop=True)
    if runs.empty:
        return pd.DataFrame(columns=list(RECAP_COLUMNS))
    tf_all, pw_all, lw_all = (np.asarray(a, dtype=float) for a in options)
    c = runs["cluster"].map(names).to_numpy(np.int64)
    tf, lw = tf_all[:, c].T, lw_all[:, c].T  # (N, K)
    has = np.isfinite(tf)
    tf_safe = np.where(has, tf, 1.0)
    share = runs["num_gpu"].to_numpy(float) * runs["gpu_milli"].fillna(1000).to_numpy(float) / 1000.0
    kw = share[:, None] * np.where(has, pw_all[:, c].T, 0.0) / 1000.0 * np.asarray(fleet.pue, float)[c][:, None]
    k_dispatch = option_of(runs["dispatch_limit_w"].to_numpy(float), lw, has)
    k_cur = option_of(runs["power_limit_w"].to_numpy(float), lw, has)
    rows_n = np.arange(len(runs))
    tf_dispatch = np.where(k_dispatch >= 0, tf_safe[rows_n, np.maximum(k_dispatch, 0)], 1.0)
    hour = pd.Timedelta(hours=1)
    start = pd.to_datetime(runs["start_time"], utc=True)
    planned = pd.to_datetime(runs["planned_end"], utc=True) - pd.to_datetime(runs["planned_start"], utc=True)
    # a resumed run first reads its checkpoint back: that time is neither the run's work nor progress on it
    restore = runs["restore_h"].fillna(0.0).to_numpy(float) if "restore_h" in runs else np.zeros(len(runs))
    work_h = np.maximum((planned / hour).to_numpy(float) - restore, 0.0) / tf_dispatch
    deadline = pd.to_datetime(runs["deadline"], utc=True)
    deadline_h = ((deadline - now) / hour).to_numpy(float)
    history = (
        [sorted(h or [], key=lambda x: utc(x[0])) for h in runs["changes"]] if "changes" in runs else [[]] * len(runs)
    )
    done, last_change = np.empty(len(runs)), np.empty(len(runs))
    for i, h in enumerate(history):
        t0 = start.iloc[i]
        if h or restore[i] > 0:  # the restore, then the limits it ran at: the one execution model
            changes = [Segment(t0, tf_dispatch[i])]
            changes += [Segment(utc(t), factor_of(w, lw[i], tf_safe[i])) for t, w in h]
            done[i] = work_done_h(resume_segments(t0, restore[i], changes), max(now, t0))
        else:
            done[i] = max((now - t0) / pd.Timedelta(hours=1), 0.0) / tf_dispatch[i]
        last_change[i] = (now - (utc(h[-1][0]) if h else t0)) / pd.Timedelta(hours=1)
    n_changes = np.array([len(h) for h in history])
    cum = Cumulatives(np.asarray(forecast, dtype=float))
    K = tf.shape[1]
    A, B = np.repeat(np.arange(K), K), np.tile(np.arange(K), K)  # every (next hour, rest) pair of options
    valid = has[:, A] & has[:, B]  # (N, P)
    share_done = done / np.maximum(work_h, 1e-12)

    def left_at(q):
        return np.maximum(work_h * errors.ratios(q, share_done) - done, settings.min_left * work_h)

    def cost_and_end(a, b, left):
        """kgCO2e and hours to the end running the next hour at option a, then the rest at b ((N,) or (N, P))."""
        left = left if np.ndim(a) == 1 else left[:, None]
        ta = np.take_along_axis(tf_safe, np.atleast_2d(a.T).T if np.ndim(a) == 1 else a, axis=1)
        tb = np.take_along_axis(tf_safe, np.atleast_2d(b.T).T if np.ndim(b) == 1 else b, axis=1)
        ka = np.take_along_axis(kw, np.atleast_2d(a.T).T if np.ndim(a) == 1 else a, axis=1)
        kb = np.take_along_axis(kw, np.atleast_2d(b.T).T if np.ndim(b) == 1 else b, axis=1)
        if np.ndim(a) == 1:
            ta, tb, ka, kb = ta[:, 0], tb[:, 0], ka[:, 0], kb[:, 0]
        first = np.minimum(1.0, left * ta)
        rest = np.maximum(left - first / ta, 0.0) * tb
        at_first = cum.to(c, first)
        kg = (ka * at_first + kb * (cum.to(c, first + rest) - at_first)) / 1000.0
        return kg, first + rest

    followed = (k_cur >= 0) & has.any(axis=1)
    kc = np.maximum(k_cur, 0)
    pairs_a, pairs_b = np.broadcast_to(A, valid.shape), np.broadcast_to(B, valid.shape)
    fastest = np.argmin(np.where(has, tf, np.inf), axis=1)
    q_used = np.full(len(runs), np.nan)
    chosen_a, chosen_b = kc.copy(), kc.copy()
    at_risk = np.zeros(len(runs), dtype=bool)
    kept_kg, kept_h = np.full(len(runs), np.nan), np.full(len(runs), np.nan)
    open_ = followed.copy()
    for q in [q for q in QUANTILES if q <= settings.top_quantile]:  # the highest at which some pair keeps it
        if not open_.any():
            break
        left = left_at(q)
        kgs, hs = cost_and_end(pairs_a, pairs_b, left)
        k_kg, k_h = cost_and_end(kc, kc, left)
        risk = k_h > deadline_h + 1e-9
        ok = valid & (hs <= deadline_h[:, None] + 1e-9)
        # a run at risk gets a faster limit for the rest, from now or after one more hour at its limit (it may end
        # within that hour; the next hour decides again), whichever keeps the deadline for less carbon
        faster_rest = tf_safe[:, B] < tf_safe[rows_n, kc][:, None]
        ok &= ~risk[:, None] | (faster_rest & ((pairs_a == pairs_b) | (pairs_a == kc[:, None])))
        take = open_ & ok.any(axis=1)
        if take.any():
            key = np.where(ok, kgs, np.inf)
            best = np.lexsort((np.where(ok, hs, np.inf), key), axis=-1)[:, 0]
            chosen_a[take], chosen_b[take] = A[best[take]], B[best[take]]
            q_used[take], at_risk[take] = q, risk[take]
            kept_kg[take], kept_h[take] = k_kg[take], k_h[take]
            open_ &= ~take
    # no limit keeps the deadline even at the median: the fastest limit
    q_low = QUANTILES[-1]
    lost = open_
    if lost.any():
        k_kg, k_h = cost_and_end(kc, kc, left_at(q_low))
        chosen_a[lost], chosen_b[lost] = fastest[lost], fastest[lost]
        q_used[lost], at_risk[lost], kept_kg[lost], kept_h[lost] = q_low, True, k_kg[lost], k_h[lost]
    left_q = np.where(np.isfinite(q_used), 0.0, np.nan)
    for q in set(q_used[np.isfinite(q_used)]):
        sel = q_used == q
        left_q[sel] = left_at(q)[sel]
    kg, h = cost_and_end(chosen_a, chosen_b, np.nan_to_num(left_q))
    changed_pair = chosen_a != kc
    calm = (last_change >= settings.min_dwell_h) & (n_changes < settings.max_changes)
    saves = kept_kg - kg >= settings.min_saving * kept_kg
    # a change for carbon keeps the deadline even for a run as long as the carbon quantile says
    sure = cost_and_end(chosen_a, chosen_b, left_at(settings.carbon_quantile))[1] <= deadline_h + 1e-9
    reason = np.where(
        at_risk, "at_risk", np.where(~changed_pair, "keep", np.where(calm & saves & sure, "carbon", "keep"))
    )
    acts = followed & (reason != "keep")  # where the chosen pair is the plan: changed now, or raised after an hour
    if not settings.enabled:
        acts[:] = False
    if "recap" in runs:  # seen, not acted on
        acts &= runs["recap"].astype(bool).to_numpy()
    act = acts & changed_pair
    k_next = np.where(act, chosen_a, kc)
    kg = np.where(acts, kg, kept_kg)
    h = np.where(acts, h, kept_h)
    median_h = left_at(q_low) * tf_safe[rows_n, k_next]
    reason = np.where(followed, reason, "no_options")
    # runs without options (or at a limit that is none of them): projected at the median at their limit
    cur_factor = np.array([factor_of(w, lw[i], tf_safe[i]) for i, w in enumerate(runs["power_limit_w"])])
    plain_h = left_at(q_low) * cur_factor
    h = np.where(followed, h, plain_h)
    median_h = np.where(followed, median_h, plain_h)
    to_limit = np.where(followed, lw[rows_n, k_next], runs["power_limit_w"].to_numpy(float))
    hours_td = lambda x: pd.to_timedelta(x, unit="h")  # noqa: E731
    out = pd.DataFrame(
        {
            "job_id": runs["job_id"].to_numpy(),
            "plan_id": runs["plan_id"].to_numpy() if "plan_id" in runs else None,
            "attempt": runs["attempt"].to_numpy() if "attempt" in runs else None,
            "cluster": runs["cluster"].to_numpy(),
            "deadline": deadline.to_numpy(),
            "from_limit_w": runs["power_limit_w"].to_numpy(float),
            "to_limit_w": to_limit,
            "time_factor": np.where(followed, tf_safe[rows_n, k_next], cur_factor) / tf_dispatch,
            "draw_kw": np.where(followed, kw[rows_n, k_next], np.nan),
            "changed": followed & (k_next != kc),
            "reason": reason,
            "quantile": np.where(followed, q_used, q_low),
            "work_h": work_h,
            "work_done_h": done,
            "work_left_h": np.where(followed, np.nan_to_num(left_q), left_at(q_low)),
            "projected_end": now + hours_td(h),
            "projected_end_kept": now + hours_td(np.where(followed, kept_h, plain_h)),
            "expected_end": now + hours_td(median_h),
            "kgco2e": np.where(followed, kg, np.nan),
            "kgco2e_kept": np.where(followed, kept_kg, np.nan),
        }
    )
    return out[list(RECAP_COLUMNS)]


def option_of(limits: np.ndarray, lw: np.ndarray, has: np.ndarray) -> np.ndarray:
    """(N,) the option whose limit is each run's `limits` (within 0.5 W), -1 where none is."""
    hit = has & (np.abs(lw - np.nan_to_num(limits, nan=-1e9)[:, None]) <= 0.5)
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1), -1)


def factor_of(limit_w, lw: np.ndarray, tf: np.ndarray) -> float:
    """The time factor (against the maximum limit) of the option whose limit is `limit_w` (1 when none is)."""
    if limit_w is None or pd.isna(limit_w):
        return 1.0
    hit = np.flatnonzero((np.abs(lw - float(limit_w)) <= 0.5) & np.isfinite(tf))
    return float(tf[hit[0]]) if len(hit) else 1.0


def explain_change(change: dict) -> str:
    """The explanation card's text of one power-limit change (a `RECAP_COLUMNS` or plan.power_changes row): why,
    at which run-time quantile, and against its counterfactual, the limit kept."""

    def at(value) -> str:
        return "?" if value is None or pd.isna(value) else utc(value).strftime("%Y-%m-%d %H:%M")

    def kg(value) -> str:
        return "?" if value is None or pd.isna(value) else f"{float(value):.3f} kgCO2e"

    verb = "Raised" if float(change["to_limit_w"]) > float(change["from_limit_w"]) else "Lowered"
    q = f"p{round(100 * float(change['quantile']))}"
    head = f"{verb} from {float(change['from_limit_w']):.0f} W to {float(change['to_limit_w']):.0f} W"
    if change["reason"] == "at_risk":
        why = (
            f"at risk: at the {q} run time ({float(change['work_left_h']):.2f} h of work left at full power) the "
            f"run would end {at(change['projected_end_kept'])}, after its deadline {at(change['deadline'])}; now it "
            f"ends {at(change['projected_end'])}"
        )
    else:
        why = (
            f"for carbon: the rest of the run emits {kg(change['kgco2e'])} instead of {kg(change['kgco2e_kept'])} at "
            f"the forecast intensity, and still ends {at(change['projected_end'])} at the {q} run time, before its "
            f"deadline {at(change['deadline'])}"
        )
    kept = f"Limit kept: ends {at(change['projected_end_kept'])}, {kg(change['kgco2e_kept'])}."
    return f"{head}: {why}. {kept}"
