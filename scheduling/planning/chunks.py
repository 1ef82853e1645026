"""Long checkpointing jobs, planned and run in chunks between checkpoints.

A checkpointing job whose work left takes longer than the plan horizon at its fastest (the default limit on the
fastest cluster that hosts it) cannot be planned on the forecast: most of its run lies past the horizon. It is planned
as its next chunk instead, `chunk_h` hours of run time at its fastest (half the horizon: a chunk started in the first
half of the horizon ends inside it) plus the checkpoint written at its end, with its deadline in the plan moved
earlier by what the rest needs after it (`rest_hours`).

The run is then decided again at the end of each chunk (chunks of that first one's length from the run's start,
`at_chunk_end`), on the forecast of that hour: it stops at its checkpoint when stopping and resuming later emits less
by the preemption rule (`pausing.pause_running`, reason `chunk`: the same 10 % saving, deadline and cap as a pause for
carbon, which is off elsewhere by default), and otherwise runs on into its next chunk. A stopped job's rest is queued
with its work kept and planned again like any job. The run-now counterfactual stays the whole job run now.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EPS = 1e-9
RESUME_WAIT_H = 1.0  # a stopped job resumes at the next hourly plan at the earliest


def chunk_hours(horizon_h: float) -> float:
    """Run time of one chunk at the job's fastest: half the plan horizon."""
    return float(horizon_h) / 2.0


def chunk_shares(fastest_left_h: np.ndarray, checkpointing: np.ndarray, horizon_h: float) -> np.ndarray:
    """Share of each job's work left that its next run does: `chunk_h / fastest_left_h` where the job checkpoints
    and its work left takes longer than `horizon_h` at its fastest (`fastest_left_h`), else 1 (the whole rest)."""
    left = np.asarray(fastest_left_h, dtype=float)
    long = np.asarray(checkpointing, dtype=bool) & np.isfinite(left) & (left > float(horizon_h) + EPS)
    return np.where(long, chunk_hours(horizon_h) / np.where(long, left, 1.0), 1.0)


def rest_hours(fastest_left_h: np.ndarray, share: np.ndarray, restore_h: np.ndarray) -> np.ndarray:
    """Hours the rest of a chunked job needs after its chunk (0 for a whole run): the wait for the next plan, the
    restore of the checkpoint, and the work after the chunk at the job's fastest. (The chunk's own run holds its
    GPUs while it writes the checkpoint: that time is the chunk's.)"""
    share = np.asarray(share, dtype=float)
    left = np.where(np.isfinite(fastest_left_h), fastest_left_h, 0.0)
    rest = RESUME_WAIT_H + np.asarray(restore_h, dtype=float) + left * (1.0 - share)
    return np.where(share < 1.0 - EPS, rest, 0.0)


def at_chunk_end(start, chunk_end, now) -> np.ndarray:
    """Whether each run, started at `start` with its first chunk ending at `chunk_end` (NaT: not in chunks), reached
    the end of a chunk in the hour up to `now` (chunks of the first one's length from its start)."""
    start = pd.to_datetime(pd.Series(start), utc=True).reset_index(drop=True)
    end = pd.to_datetime(pd.Series(chunk_end), utc=True).reset_index(drop=True)
    length_h = ((end - start) / pd.Timedelta(hours=1)).to_numpy(float)
    ran_h = ((pd.Timestamp(now) - start) / pd.Timedelta(hours=1)).to_numpy(float)
    ok = np.isfinite(length_h) & (length_h > 0)
    n = np.floor(np.where(ok, ran_h / np.where(ok, length_h, 1.0), 0.0))
    return ok & (n >= 1) & (ran_h - n * np.where(ok, length_h, 0.0) < 1.0)
