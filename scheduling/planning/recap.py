"""Every hour, the progress of each running job and the GPU power limit it runs at next (`recap_running`).

Progress (`scheduling.domain.progress`): a run's work is its planned run time at its dispatch limit, in hours at
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
cheapest faster limit that keeps it for the whole rest, raised now, else the fastest limit) or, for carbon, when the
changed run still ends by its deadline at the `carbon_quantile` (p99), the change saves at least `min_saving` of
the rest of the run's forecast carbon, the last change is `min_dwell_h` old and the run has changed fewer than
`max_changes` times. Its counterfactual is the limit kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from common.timeutil import utc
from scheduling.domain.progress import Segment, work_done_h

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

    def ratio(self, q: float, at_least: float = 0.0) -> float:
        """The q-quantile of the ratio given that it exceeds `at_least` (a run still going after doing that share of
        its planned work): F^-1(F(a) + q (1 - F(a)))."""
        lo = _NORMAL.cdf((np.log(at_least) - self.mu) / self.sigma) if at_least > 0 else 0.0
        u = min(lo + q * (1.0 - lo), 1.0 - 1e-9)
        return float(np.exp(self.mu + self.sigma * _NORMAL.inv_cdf(u)))


_NORMAL = NormalDist()


class _Cumulative:
    """∫ intensity dt from hour 0 to t, for an hourly series (the last hour's value holds beyond it)."""

    def __init__(self, ci: np.ndarray):
        self.ci = np.asarray(ci, dtype=float)
        self.cum = np.concatenate([[0.0], np.cumsum(self.ci)])
        self.n = len(self.ci)

    def to(self, t):
        t = np.asarray(t, dtype=float)
        inside = np.clip(t, 0.0, self.n)
        hour = np.minimum(inside.astype(np.int64), self.n - 1)
        return self.cum[hour] + (inside - hour) * self.ci[hour] + np.maximum(t - self.n, 0.0) * self.ci[-1]


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
    changes: [(time, limit_w), ...] before now; optional recap: False where the executor cannot change a limit,
    whose run is then only projected); `options`: the (K, C) time factors, average power per GPU (W) and limits
    (W) of `option_arrays`; `forecast` (H, C) g/kWh per cluster from `now`."""
    now = utc(now)
    if runs is None or runs.empty:
        return pd.DataFrame(columns=list(RECAP_COLUMNS))
    tf, pw, lw = options
    names = {n: i for i, n in enumerate(fleet.names)}
    pue = fleet.pue
    rows = []
    for run in runs.to_dict(orient="records"):
        c = names.get(run["cluster"])
        if c is None:
            continue
        opts = np.flatnonzero(np.isfinite(tf[:, c]))
        row = _recap_one(run, opts, tf[:, c], pw[:, c], lw[:, c], pue[c], forecast[:, c], now, errors, settings)
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RECAP_COLUMNS))


def _factor_of(limit_w, lw: np.ndarray, tf: np.ndarray) -> float:
    """The time factor (against the maximum limit) of the option whose limit is `limit_w` (1 when none is)."""
    if limit_w is None or pd.isna(limit_w):
        return 1.0
    hit = np.flatnonzero((np.abs(lw - float(limit_w)) <= 0.5) & np.isfinite(tf))
    return float(tf[hit[0]]) if len(hit) else 1.0


def _recap_one(run, opts, tf, pw, lw, pue, ci, now, errors, settings) -> dict:
    tf_dispatch = _factor_of(run.get("dispatch_limit_w"), lw, tf)
    planned_h = (utc(run["planned_end"]) - utc(run["planned_start"])).total_seconds() / 3600.0
    work_h = planned_h / tf_dispatch
    start = utc(run["start_time"])
    history = sorted(run.get("changes") or [], key=lambda x: utc(x[0]))
    segments = [Segment(start, tf_dispatch), *(Segment(utc(t), _factor_of(w, lw, tf)) for t, w in history)]
    done = work_done_h(segments, max(now, start))
    current = run.get("power_limit_w")
    k_cur = next((int(k) for k in opts if abs(lw[k] - float(current)) <= 0.5), None) if pd.notna(current) else None
    share = float(run["num_gpu"]) * float(run.get("gpu_milli") or 1000) / 1000.0
    kw = share * pw / 1000.0 * pue  # (K,)
    deadline_h = (utc(run["deadline"]) - now).total_seconds() / 3600.0
    base = {
        "job_id": run["job_id"],
        "plan_id": run.get("plan_id"),
        "attempt": run.get("attempt"),
        "cluster": run["cluster"],
        "deadline": utc(run["deadline"]),
        "from_limit_w": current,
        "work_h": work_h,
        "work_done_h": done,
    }

    def left_at(q):
        return max(work_h * errors.ratio(q, done / work_h) - done, settings.min_left * work_h)

    cum = _Cumulative(ci)

    def cost_and_end(a, b, left):
        """kgCO2e and hours to the end running the next hour at option(s) a, then the rest at b (arrays or ints)."""
        first = np.minimum(1.0, left * tf[a])
        rest = np.maximum(left - first / tf[a], 0.0) * tf[b]
        at_first = cum.to(first)
        kg = (kw[a] * at_first + kw[b] * (cum.to(first + rest) - at_first)) / 1000.0
        return kg, first + rest

    if not len(opts) or k_cur is None:
        q = QUANTILES[-1]
        left = left_at(q)
        end = now + pd.Timedelta(hours=left * _factor_of(current, lw, tf))
        return {**base, "to_limit_w": current, "time_factor": _factor_of(current, lw, tf) / tf_dispatch,
                "draw_kw": np.nan, "changed": False, "reason": "no_options", "quantile": q, "work_left_h": left,
                "projected_end": end, "projected_end_kept": end, "expected_end": end, "kgco2e": np.nan,
                "kgco2e_kept": np.nan}  # fmt: skip
    A, B = np.repeat(opts, len(opts)), np.tile(opts, len(opts))  # every (next hour, rest) pair of options
    chosen = None
    for q in [q for q in QUANTILES if q <= settings.top_quantile]:  # the highest at which some pair keeps it
        left = left_at(q)
        kgs, hs = cost_and_end(A, B, left)
        kept = int(np.flatnonzero((A == k_cur) & (B == k_cur))[0])
        kept_kg, kept_h = float(kgs[kept]), float(hs[kept])
        at_risk = kept_h > deadline_h + 1e-9
        ok = hs <= deadline_h + 1e-9
        if at_risk:  # raised now, to one limit for the rest: waiting for the last hour leaves no margin for error
            ok &= (A == B) & (tf[A] < tf[k_cur])
        if ok.any():
            best = np.flatnonzero(ok)[np.lexsort((hs[ok], kgs[ok]))[0]]
            chosen = (q, left, (float(kgs[best]), int(A[best]), int(B[best]), float(hs[best])), at_risk)
            break
    if chosen is None:  # no limit keeps the deadline even at the median: the fastest limit
        q, left = QUANTILES[-1], left_at(QUANTILES[-1])
        fastest = int(opts[np.argmin(tf[opts])])
        (kg, h), k_next, reason = cost_and_end(fastest, fastest, left), fastest, "at_risk"
        kg, h = float(kg), float(h)
    else:
        q, left, (kg, k_next, k_rest, h), at_risk = chosen
        if at_risk:
            reason = "at_risk"
        elif k_next == k_cur:
            reason = "keep"
        else:
            last = utc(history[-1][0]) if history else start
            calm = (now - last).total_seconds() / 3600.0 >= settings.min_dwell_h and len(history) < settings.max_changes
            saves = kept_kg - kg >= settings.min_saving * kept_kg
            # a change for carbon keeps the deadline even for a run as long as the carbon quantile says
            sure = float(cost_and_end(k_next, k_rest, left_at(settings.carbon_quantile))[1]) <= deadline_h + 1e-9
            reason = "carbon" if (calm and saves and sure) else "keep"
        if reason == "keep":
            k_next, kg, h = k_cur, kept_kg, kept_h
    if (not settings.enabled or run.get("recap") is False) and k_next != k_cur:  # seen, not acted on
        k_next, kg, h = k_cur, kept_kg, kept_h
    median_h = left_at(QUANTILES[-1]) * tf[k_next]
    return {
        **base,
        "to_limit_w": float(lw[k_next]),
        "time_factor": float(tf[k_next]) / tf_dispatch,
        "draw_kw": float(kw[k_next]),
        "changed": k_next != k_cur,
        "reason": reason,
        "quantile": q,
        "work_left_h": left,
        "projected_end": now + pd.Timedelta(hours=h),
        "projected_end_kept": now + pd.Timedelta(hours=kept_h),
        "expected_end": now + pd.Timedelta(hours=median_h),
        "kgco2e": kg,
        "kgco2e_kept": kept_kg,
    }


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
