"""How a run of a job advances: the one execution model of the replay executor, the planner and the simulator.

Work is counted in reference hours: the hours a run takes at its reference limit (time factor 1; the replay: its
dispatch limit; the simulator: the option it started at). A run goes in segments, each from a time on at one limit
whose `time_factor` is its run time relative to the reference (a lower limit is slower, `time_factor` > 1), so a
segment of `d` wall hours does `d / time_factor` hours of work. Times are pandas Timestamps (executors, ledger) or
plain float hours (the simulator): the same formulas serve both.

    segments = [Segment(start, 1.0), Segment(start + 3h, 1.12)]      # capped three hours in
    done = work_done_h(segments, now)                                  # reference hours done by `now`
    end = end_time(segments, work_h)                                   # when `work_h` is done

Checkpoints, preemption and resumption (`Checkpoint`): a checkpointing run told to stop at `at` gets a warning
signal `save_h` before it, writes its checkpoint meanwhile (no progress) and keeps the work it had done at the
signal (`kept_work_h`); a run without checkpoints keeps nothing. A resumed run first restores its checkpoint for
`restore_h` wall hours (no progress, at the power of its limit), then works on (`resume_segments`).

Failures: an attempt that fails after a share `fraction` of its work ends where that work is done
(`failure_work_h`); it keeps no work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from common.timeutil import utc

DEFAULT_CHECKPOINT_MIN = 5.0  # minutes to write (and to restore) a checkpoint: the upper end of the seeds' 2-5 min


class Segment(NamedTuple):
    start: pd.Timestamp | float  # from this time on (until the next segment's start); float: hours
    time_factor: float  # run time at this limit relative to the reference limit (> 0)


@dataclass(frozen=True)
class Checkpoint:
    """What stopping and resuming a checkpointing run costs, in wall hours without progress."""

    save_h: float  # from the warning signal to the stop: the checkpoint is written
    restore_h: float  # from a resumed run's start until its work goes on: the checkpoint is read

    @classmethod
    def minutes(cls, overhead_min: float) -> Checkpoint:
        """The same `overhead_min` minutes to save and to restore."""
        if not (math.isfinite(overhead_min) and overhead_min >= 0):
            raise ValueError(f"checkpoint overhead must be a non-negative number of minutes, got {overhead_min!r}")
        return cls(overhead_min / 60.0, overhead_min / 60.0)

    @property
    def wall_h(self) -> float:
        """Wall hours a preemption costs the job: the save and the restore."""
        return self.save_h + self.restore_h


def _span_h(a, b) -> float:
    """Hours from `a` to `b`."""
    d = b - a
    return d.total_seconds() / 3600.0 if isinstance(d, pd.Timedelta) else float(d)


def _after(t, hours: float):
    """`hours` after `t` (microsecond resolution for Timestamps, as the executors' times)."""
    return t + pd.Timedelta(microseconds=round(hours * 3.6e9)) if isinstance(t, pd.Timestamp) else t + hours


def _time(t):
    return t if isinstance(t, (int, float, np.integer, np.floating)) else utc(t)


def check_segments(segments: Sequence[Segment]) -> list[Segment]:
    """`segments` sorted by start, with valid time factors; ValueError naming the bad one."""
    if not segments:
        raise ValueError("a run needs at least one segment (its start)")
    out = sorted((Segment(_time(s.start), float(s.time_factor)) for s in segments), key=lambda s: s.start)
    for s in out:
        if not (math.isfinite(s.time_factor) and s.time_factor > 0):
            raise ValueError(f"segment from {s.start}: time_factor must be a positive number, got {s.time_factor!r}")
    return out


def work_done_h(segments: Sequence[Segment], at) -> float:
    """Reference hours of work done from the first segment's start until `at` (0 before the start)."""
    segs = check_segments(segments)
    at = _time(at)
    done = 0.0
    for s, nxt in zip(segs, [*segs[1:], None]):
        stop = at if nxt is None else min(at, nxt.start)
        if stop <= s.start:
            break
        done += _span_h(s.start, stop) / s.time_factor
    return done


def end_time(segments: Sequence[Segment], work_h: float):
    """When `work_h` reference hours are done: the last segment runs on until the work is finished."""
    if not (math.isfinite(work_h) and work_h >= 0):
        raise ValueError(f"work_h must be a non-negative number, got {work_h!r}")
    segs = check_segments(segments)
    left = float(work_h)
    for s, nxt in zip(segs, [*segs[1:], None]):
        span_h = math.inf if nxt is None else _span_h(s.start, nxt.start)
        if left <= span_h / s.time_factor + 1e-12:
            return _after(s.start, left * s.time_factor)
        left -= span_h / s.time_factor
    raise AssertionError("unreachable: the last segment is unbounded")


def hours_left(work_left_h: float, time_factor: float) -> float:
    """Wall hours to finish `work_left_h` reference hours at a limit of `time_factor`."""
    return max(float(work_left_h), 0.0) * float(time_factor)


def resume_segments(start, restore_h: float, changes: Sequence[Segment] = ()) -> list[Segment]:
    """The segments of a run started at `start` that first restores a checkpoint for `restore_h` hours (0: a
    first start) and then works at time factor 1, or at the factors of the power `changes` from their times on; a
    change during the restore takes effect when the work begins."""
    begin = _after(_time(start), float(restore_h))
    changes = sorted((Segment(_time(c.start), float(c.time_factor)) for c in changes), key=lambda c: c.start)
    factor = 1.0
    for c in changes:
        if c.start <= begin:
            factor = c.time_factor
    return [Segment(begin, factor), *(c for c in changes if c.start > begin)]


def kept_work_h(segments: Sequence[Segment], stop_at, save_h: float, checkpointing: bool = True) -> float:
    """Reference hours of work a run stopped at `stop_at` keeps: a checkpointing run the work it had done at the
    warning signal `save_h` before the stop (its checkpoint), another run nothing."""
    if not checkpointing:
        return 0.0
    return work_done_h(segments, _after(_time(stop_at), -float(save_h)))


def failure_work_h(work_h: float, fraction: float | None) -> float:
    """Reference hours an attempt of `work_h` does before it ends: all of it, or the `fraction` after which it
    fails."""
    return float(work_h) if fraction is None else float(work_h) * float(fraction)


def kept_share(
    ran_h: np.ndarray, full_h: np.ndarray, done_before: np.ndarray, save_h, restore_h, checkpointing: np.ndarray
) -> np.ndarray:
    """`kept_work_h` for many runs at one limit each, as shares of their jobs: runs that have been going `ran_h`
    wall hours (a restore of `restore_h` first where the job had kept work, `done_before` > 0), whose whole job
    takes `full_h` at that limit, stopped now. Below 1: a stopped job always has work left."""
    ran = np.asarray(ran_h, dtype=float) - np.where(np.asarray(done_before) > 0, restore_h, 0.0)
    worked = np.maximum(ran - save_h, 0.0) / np.asarray(full_h, dtype=float)
    return np.minimum(done_before + np.where(checkpointing, worked, 0.0), 0.999)


def run_wall_h(full_h, done_before, restore_h) -> np.ndarray:
    """Wall hours a run at one limit takes to finish its job from `done_before` (share kept), whose whole job takes
    `full_h` there: the restore (when resumed with work kept), then the work left."""
    done = np.asarray(done_before, dtype=float)
    return np.where(done > 0, restore_h, 0.0) + np.asarray(full_h, dtype=float) * (1.0 - done)
