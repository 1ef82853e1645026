"""UTC timestamps: planning and forecasting never read the wall clock, they take a time and normalise it here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd

HOUR = pd.Timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(value) -> pd.Timestamp:
    """A UTC timestamp from anything pandas understands; a naive value is taken as UTC.

    Raises ValueError on a missing value (None, NaN, NaT), naming it.
    """
    ts = pd.Timestamp(value)
    if ts is pd.NaT:
        raise ValueError(f"not a timestamp: {value!r}")
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def utc_hour(value) -> pd.Timestamp:
    """`utc(value)` floored to the start of its hour (hourly data is keyed by the hour's start)."""
    return utc(value).floor("h")


def iso_z(value) -> str:
    """ISO 8601 in UTC with a `Z`, seconds precision: 2021-07-15T12:00:00Z."""
    # whole seconds from the epoch by integer division: Timestamp.floor costs ~30x more, and plans format many times
    seconds = utc(value).value // 1_000_000_000
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value, name: str) -> pd.Timestamp:
    """`utc(value)` for user input (CLI arguments, DAG Params): a ValueError naming `name` when `value` is empty or
    not a date/time."""
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be an ISO date/time such as 2021-07-15T12:00Z, got {value!r}") from None
    if ts is pd.NaT:
        raise ValueError(f"{name} is empty")
    return utc(ts)
