"""How a run advances under GPU power limits that change while it runs: the one execution model.

A run has `work_h`, its work in hours at a reference limit (time factor 1). It runs in segments, each from a time
on at one limit whose `time_factor` is the run time at that limit relative to the reference (from the power model:
a lower limit runs slower, `time_factor` > 1), so a segment of `d` hours does `d / time_factor` hours of work.

    segments = [Segment(start, 1.0), Segment(start + 3h, 1.12)]      # capped three hours in
    done = work_done_h(segments, now)                                  # reference hours done by `now`
    end = end_time(segments, work_h)                                   # when `work_h` is done

The replay executor advances its runs with it, the planner projects the end of a running job with it, and the
ledger's piecewise valuation follows the same segments (one limit per segment).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import pandas as pd

from common.timeutil import utc


class Segment(NamedTuple):
    start: pd.Timestamp  # from this time on (until the next segment's start)
    time_factor: float  # run time at this limit relative to the reference limit (> 0)


def check_segments(segments: Sequence[Segment]) -> list[Segment]:
    """`segments` sorted by start, with valid time factors; ValueError naming the bad one."""
    if not segments:
        raise ValueError("a run needs at least one segment (its start)")
    out = sorted((Segment(utc(s.start), float(s.time_factor)) for s in segments), key=lambda s: s.start)
    for s in out:
        if not (math.isfinite(s.time_factor) and s.time_factor > 0):
            raise ValueError(f"segment from {s.start}: time_factor must be a positive number, got {s.time_factor!r}")
    return out


def work_done_h(segments: Sequence[Segment], at) -> float:
    """Reference hours of work done from the first segment's start until `at` (0 before the start)."""
    segs = check_segments(segments)
    at = utc(at)
    done = 0.0
    for s, nxt in zip(segs, [*segs[1:], None]):
        stop = at if nxt is None else min(at, nxt.start)
        if stop <= s.start:
            break
        done += (stop - s.start).total_seconds() / 3600.0 / s.time_factor
    return done


def end_time(segments: Sequence[Segment], work_h: float) -> pd.Timestamp:
    """When `work_h` reference hours are done: the last segment runs on until the work is finished (microsecond
    resolution, as the executors' times)."""
    if not (math.isfinite(work_h) and work_h >= 0):
        raise ValueError(f"work_h must be a non-negative number, got {work_h!r}")
    segs = check_segments(segments)
    left = float(work_h)
    for s, nxt in zip(segs, [*segs[1:], None]):
        span_h = math.inf if nxt is None else (nxt.start - s.start).total_seconds() / 3600.0
        if left <= span_h / s.time_factor + 1e-12:
            return s.start + pd.Timedelta(microseconds=round(left * s.time_factor * 3.6e9))
        left -= span_h / s.time_factor
    raise AssertionError("unreachable: the last segment is unbounded")


def hours_left(work_left_h: float, time_factor: float) -> float:
    """Wall hours to finish `work_left_h` reference hours at a limit of `time_factor`."""
    return max(float(work_left_h), 0.0) * float(time_factor)
