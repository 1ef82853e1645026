"""Long checkpointing jobs, planned and run in chunks between checkpoints.

A checkpointing job whose work left takes longer than the plan horizon at its fastest (the default limit on the
fastest cluster that hosts it) cannot be planned on the forecast: most of its run lies past the horizon. It is planned
as its next chunk instead, `chunk_h` hours of run time at its fastest (half the horizon: a chunk started in the first
half of the horizon ends inside it), and runs until that chunk is done; then it stops at a checkpoint (a preemption
with reason `chunk`, `pausing.pause_running`), its work is kept, and the rest is planned again like any queued job:
in the cleanest hours and clusters that still keep its deadline, or in chunks again while it is still that long.

The stopped job is queued again for the next hour's plan (its executor reports the stop then), and its GPUs wait for
it until then: the stop hour's plan starts nothing on them, so the rest may resume in place (`service.running_ends`,
`HourlyPlanner.end_chunks`). The chunk's deadline in the plan is the job's less what the rest needs after it
(`rest_hours`): the rest at the job's fastest, restoring the checkpoint first, plus that hour's wait, and the same stop
again for every further chunk the rest needs. Each chunk costs the checkpoint's save and restore and that hour; the
run-now counterfactual stays the whole job run now.
"""

from __future__ import annotations

import numpy as np

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


def rest_hours(fastest_left_h: np.ndarray, share: np.ndarray, restore_h: np.ndarray, horizon_h: float) -> np.ndarray:
    """Hours the rest of a chunked job needs after its chunk (0 for a whole run): the wait for the next plan, the
    restore of the checkpoint, the work after the chunk at the job's fastest, and for each further chunk the rest
    still needs (while longer than `horizon_h`) its checkpoint, the wait and the restore. (The chunk's own run holds
    its GPUs while it writes the checkpoint: that time is the chunk's.)"""
    share = np.asarray(share, dtype=float)
    restore = np.asarray(restore_h, dtype=float)
    left = np.where(np.isfinite(fastest_left_h), fastest_left_h, 0.0)
    after = left * (1.0 - share)
    further = np.maximum(np.ceil((after - float(horizon_h)) / chunk_hours(horizon_h) - EPS), 0.0)
    rest = RESUME_WAIT_H + restore + after + further * (restore + RESUME_WAIT_H + restore)
    return np.where(share < 1.0 - EPS, rest, 0.0)
