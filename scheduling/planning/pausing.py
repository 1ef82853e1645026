"""Every hour, which running checkpointing jobs to stop at a checkpoint: through a dirty stretch (`pause_running`:
preemption for carbon), off a drained node, or to make room for a job due now (`evictable_running`: the plan's
agents choose the victims).

A run is paused when stopping it now and resuming it at a later hour emits at least `min_saving` less than running
on, by the forecast, the pause's cost included (`scheduling.domain.execution`): the work done since the checkpoint
signal (`save_h` before the stop) is lost and done again, and the resumed run first restores the checkpoint for
`save_h`, at its draw. Both sides run the rest at the limit the hour's recap chose, and its median run time
(`recap.RunTimeError`, given the share already done). The resumed run must still end by the deadline at the p99
run time x `slack_factor` plus `slack_h`, resumed at that hour: the resume hour is the cleanest such one. Only
runs the recap does not raise (at risk), of jobs that checkpoint, on executors that can preempt, preempted fewer
than `max_preemptions` times, are paused. A job's spec may give its own checkpoint time (`checkpoint_overhead_min`)
and cap (`max_preemptions`); the settings are the defaults. Its counterfactual is "keep running".

Pausing for carbon is opt-in (`Pausing(for_carbon=True)`): on the evaluation's default trace it saved 0.2 % at
load 0.5 and cost 1.2 % at 0.8 (docs/results/planner/loop.md, "Preemption at checkpoints"), where the stopped
jobs' capacity goes to others and they resume somewhere dirtier.

For a job due now that no node takes (`Pausing(for_deadline=True)`, opt-in), the plan may preempt the runs
that, resumed from the next hour, still end by their deadline at the p99 run time (`evict_slack_factor`,
`evict_slack_h`: no margin on top, since the due job is late for sure otherwise); the cluster agent picks the
cheapest victims that make room on one node (`ClusterAgent.evict_for`; reason `deadline`). Opt-in because it
buys deadlines with carbon on the shared-GPU workloads (docs/results/planner/summary.md, "With and without
preemption for due jobs").

A run on a drained node (`drained`: the operator or the resource manager empties it) is handed to migration the
same way, whatever the carbon: stopped now when, resumed from the next hour, it still keeps its deadline by that
rule (reason `drained`; the next hour's plan places it on a schedulable node). Otherwise it runs on there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from common.timeutil import utc
from scheduling.domain.execution import DEFAULT_CHECKPOINT_MIN
from scheduling.planning.recap import QUANTILES, Cumulatives, RunTimeError, option_of

PAUSE_COLUMNS = (
    "job_id",
    "plan_id",  # the run's (its dispatch plan)
    "attempt",
    "cluster",
    "reason",  # carbon | drained | deadline | chunk
    "save_h",  # hours the job takes to write its checkpoint (and to read it back)
    "work_done",  # share of the whole job the checkpoint is expected to keep
    "kgco2e_kept",  # the rest of the run kept running, forecast intensity (median run time)
    "kgco2e",  # stopped now and resumed at `resume_at`, the lost work and the restore included
    "resume_at",
)


@dataclass(frozen=True)
class Pausing:
    """Settings of `pause_running` (see the module doc)."""

    enabled: bool = True
    for_carbon: bool = False  # off: only runs on drained nodes move (see the module doc)
    for_deadline: bool = False  # on: the plan may preempt runs to start a job due now (`evictable_running`)
    min_saving: float = 0.10
    slack_factor: float = 1.1
    slack_h: float = 1.0
    # a victim of a job due now needs only its p99 end, resumed an hour later: the due job is late for sure otherwise
    evict_slack_factor: float = 1.0
    evict_slack_h: float = 0.0
    max_preemptions: int = 2
    save_h: float = DEFAULT_CHECKPOINT_MIN / 60.0
    deadline_quantile: float = QUANTILES[0]


def pause_running(
    recaps: pd.DataFrame,
    runs: pd.DataFrame,
    fleet,
    options: tuple[np.ndarray, np.ndarray, np.ndarray],
    forecast: np.ndarray,
    now,
    errors: RunTimeError,
    settings: Pausing = Pausing(),
    drained: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """PAUSE_COLUMNS rows of the runs to stop now, for carbon or because their node is drained (job ids
    `drained`). `recaps`: the hour's `recap.recap_running` rows; `runs`: the running jobs (job_id, num_gpu,
    gpu_milli, checkpointing, preemptions, work_done (share of the job done before this run), preempt (whether the
    executor can); optionally the spec's checkpoint_overhead_min and max_preemptions, empty: the settings');
    `options` and `forecast` as `recap_running`'s."""
    c = _Pausable.of(recaps, runs, fleet, options, forecast, now, errors, settings)
    if c is None:
        return pd.DataFrame(columns=list(PAUSE_COLUMNS))
    moving = c.r["job_id"].isin(drained).to_numpy()
    ok = c.ok.copy()
    ok[moving, 1:] = False  # a drained node's job resumes as soon as it can, elsewhere
    n = np.arange(len(c.r))
    best = np.argmin(np.where(ok, c.kg, np.inf), axis=1)
    best_kg = np.where(ok.any(axis=1), c.kg[n, best], np.inf)
    saves = settings.for_carbon & c.pausable & (best_kg <= (1.0 - settings.min_saving) * c.keep_kg)
    moves = moving & ok[:, 0] & c.pausable
    chunk = c.chunk_done & ~saves & ~moves  # the rest is planned again from the next hour
    reason = np.where(moves, "drained", np.where(chunk, "chunk", "carbon"))
    out = c.rows(reason, np.where(chunk, c.kg[:, 0], best_kg), np.where(chunk, c.hours[0], c.hours[best]))
    return out[saves | moves | chunk].reset_index(drop=True)


def evictable_running(
    recaps: pd.DataFrame,
    runs: pd.DataFrame,
    fleet,
    options: tuple[np.ndarray, np.ndarray, np.ndarray],
    forecast: np.ndarray,
    now,
    errors: RunTimeError,
    settings: Pausing = Pausing(),
) -> pd.DataFrame:
    """The runs the hour's plan may preempt to start a job due now (`Pausing.for_deadline`): PAUSE_COLUMNS rows
    (reason `deadline`, resumed from the next hour) of the runs the module doc's rule lets stop now and resume an
    hour later, plus `cost`, the GPU-milli-hours the stop costs the fleet (the rest, the lost work and the restore:
    the victims the agents minimise, `ClusterAgent.evict_for`). Same arguments as `pause_running`."""
    margins = replace(settings, slack_factor=settings.evict_slack_factor, slack_h=settings.evict_slack_h)
    c = _Pausable.of(recaps, runs, fleet, options, forecast, now, errors, margins) if settings.for_deadline else None
    if c is None:
        return pd.DataFrame(columns=[*PAUSE_COLUMNS, "cost"])
    out = c.rows("deadline", c.kg[:, 0], c.hours[0])
    out["cost"] = c.share * 1000.0 * c.pause_h
    return out[c.ok[:, 0] & c.pausable].reset_index(drop=True)


@dataclass
class _Pausable:
    """The runs that may be preempted now (`pausable`: checkpointing, not at risk, on an executor that can,
    preempted fewer than `max_preemptions` times), and those whose chunk is done (`chunk_done`: checkpointing, on an
    executor that can, `chunk_end` reached; `scheduling.planning.chunks`), with, for each, the forecast carbon of
    running on (`keep_kg`) and of stopping now and resuming at each later hour (`kg`, `hours` from now), and whether
    that resumption keeps the deadline (`ok`)."""

    r: pd.DataFrame
    now: pd.Timestamp
    settings: Pausing
    save_h: np.ndarray  # hours to write the checkpoint (and to read it back)
    share: np.ndarray  # GPUs held
    pause_h: np.ndarray  # hours a resumed run takes: restore, the rest and the lost work
    kept: np.ndarray  # share of the whole job a stop now keeps
    keep_kg: np.ndarray
    hours: np.ndarray
    kg: np.ndarray
    ok: np.ndarray
    pausable: np.ndarray
    chunk_done: np.ndarray

    @classmethod
    def of(cls, recaps, runs, fleet, options, forecast, now, errors, settings) -> _Pausable | None:
        now = utc(now)
        if not settings.enabled or recaps is None or recaps.empty or runs is None or runs.empty:
            return None
        names = {n: i for i, n in enumerate(fleet.names)}
        own = [c for c in (*_PER_JOB, "chunk_end") if c in runs.columns]
        r = recaps.merge(runs[["job_id", "num_gpu", "gpu_milli", *_FLAGS, *own]], on="job_id", how="inner")
        r = r[r["cluster"].isin(names)]
        cap = _per_job(r, "max_preemptions", settings.max_preemptions)
        can = r["checkpointing"].fillna(False).astype(bool) & r["preempt"].fillna(False).astype(bool)
        pausable = (
            can
            & (r["reason"] != "at_risk")
            & (r["preemptions"].fillna(0).to_numpy(float) < cap)
            & (r["work_done_h"] > 0)
        )
        ends = pd.to_datetime(r["chunk_end"] if "chunk_end" in r.columns else pd.Series(pd.NaT, r.index), utc=True)
        chunk_done = can & ends.notna() & (ends <= now)
        keep = (pausable | chunk_done).to_numpy()
        r = r[keep].reset_index(drop=True)
        pausable, chunk_done = pausable.to_numpy()[keep], chunk_done.to_numpy()[keep]
        if r.empty:
            return None
        tf_all, pw_all, lw_all = (np.asarray(a, dtype=float) for a in options)
        c = r["cluster"].map(names).to_numpy(np.int64)
        tf, lw = tf_all[:, c].T, lw_all[:, c].T
        k = option_of(r["to_limit_w"].to_numpy(float), lw, np.isfinite(tf))
        known = k >= 0
        r, c, k = r[known].reset_index(drop=True), c[known], k[known]
        pausable, chunk_done = pausable[known], chunk_done[known]
        if r.empty:
            return None
        tf_run = tf_all[k, c]
        share = r["num_gpu"].to_numpy(float) * r["gpu_milli"].fillna(1000).to_numpy(float) / 1000.0
        kw = share * pw_all[k, c] / 1000.0 * np.asarray(fleet.pue, float)[c]
        work_h, done = r["work_h"].to_numpy(float), r["work_done_h"].to_numpy(float)
        share_done = done / np.maximum(work_h, 1e-12)

        def left(q):
            return np.maximum(work_h * errors.ratios(q, share_done) - done, 0.0)

        save_h = _per_job(r, "checkpoint_overhead_min", 60.0 * settings.save_h) / 60.0
        lost = np.minimum(save_h / tf_run, done)  # reference hours since the checkpoint signal
        cum = Cumulatives(np.asarray(forecast, dtype=float))
        keep_kg = kw * cum.to(c, left(0.5) * tf_run) / 1000.0
        pause_h = save_h + (left(0.5) + lost) * tf_run  # restore, then the rest and the lost work
        sure_h = save_h + settings.slack_factor * (left(settings.deadline_quantile) + lost) * tf_run
        deadline_h = ((pd.to_datetime(r["deadline"], utc=True) - now) / pd.Timedelta(hours=1)).to_numpy(float)
        hours = np.arange(1, max(int(np.asarray(forecast).shape[0]), 2), dtype=float)  # resume hours from now
        resume = np.broadcast_to(hours, (len(r), len(hours)))
        kg = kw[:, None] * (cum.to(c, resume + pause_h[:, None]) - cum.to(c, resume)) / 1000.0
        ok = hours[None, :] + sure_h[:, None] + settings.slack_h <= deadline_h[:, None]
        before = r["work_done"].fillna(0.0).to_numpy(float)
        kept = before + (1.0 - before) * np.maximum(done - lost, 0.0) / np.maximum(work_h, 1e-12)
        return cls(r, now, settings, save_h, share, pause_h, kept, keep_kg, hours, kg, ok, pausable, chunk_done)

    def rows(self, reason, kg: np.ndarray, resume_h) -> pd.DataFrame:
        """PAUSE_COLUMNS rows of every run, stopped for `reason`, emitting `kg` resumed `resume_h` hours from now."""
        r = self.r
        return pd.DataFrame(
            {
                "job_id": r["job_id"],
                "plan_id": r["plan_id"],
                "attempt": r["attempt"],
                "cluster": r["cluster"],
                "reason": reason,
                "save_h": self.save_h,
                "work_done": np.minimum(self.kept, 0.999),
                "kgco2e_kept": self.keep_kg,
                "kgco2e": kg,
                "resume_at": self.now + pd.to_timedelta(resume_h, unit="h"),
            }
        )[list(PAUSE_COLUMNS)]


_FLAGS = ("checkpointing", "preemptions", "work_done", "preempt")
_PER_JOB = ("checkpoint_overhead_min", "max_preemptions")  # the job spec's, where given (else the settings')


def _per_job(r: pd.DataFrame, column: str, default: float) -> np.ndarray:
    """A per-job setting of the runs `r` as floats: the job's own where it gives one, else `default`."""
    if column not in r.columns:
        return np.full(len(r), float(default))
    return pd.to_numeric(r[column], errors="coerce").fillna(default).to_numpy(float)


def explain_pause(pause: dict) -> str:
    """The explanation card's text of one preemption (a PAUSE_COLUMNS or plan.preemptions row), against its
    counterfactual, keep running."""

    def kg(value) -> str:
        return "?" if value is None or pd.isna(value) else f"{float(value):.3f} kgCO2e"

    resume = pause.get("resume_at")
    when = "?" if resume is None or pd.isna(resume) else utc(resume).strftime("%Y-%m-%d %H:%M")
    why = {
        "drained": "its node is drained",
        "deadline": "to make room for a job due now",
        "chunk": "its chunk of work is done (a job longer than the plan horizon runs between checkpoints, the rest "
        "planned again)",
    }.get(pause.get("reason"), "for carbon")
    return (
        f"Preempted at a checkpoint, {why}: stopped now and resumed from {when}, the rest of the run emits "
        f"{kg(pause.get('kgco2e'))} at the forecast intensity, with {60 * float(pause['save_h']):.0f} min to write "
        f"and as long to read the checkpoint, and the work since the checkpoint done again; it keeps "
        f"{100 * float(pause['work_done']):.1f} % of the job. Kept running: {kg(pause.get('kgco2e_kept'))}."
    )
