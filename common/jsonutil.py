"""Deterministic JSON: the same value always gives the same text (plans, explanations, registry metadata)."""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from typing import Any

import numpy as np
import pandas as pd

from common.timeutil import iso_z


def to_jsonable(value: Any) -> Any:
    """Plain JSON types: timestamps as ISO Z strings, numpy scalars as Python numbers, NaN/inf as null,
    tuples as lists, sets as sorted lists, mapping keys as strings; anything else as str()."""
    kind = type(value)  # the plain types first, by identity: a plan's records are mostly made of them
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return None if math.isnan(value) or math.isinf(value) else value
    if kind is dict:
        return {k if type(k) is str else str(k): to_jsonable(v) for k, v in value.items()}
    if kind is list:
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(value, (pd.Timestamp, datetime, np.datetime64)):
        ts = pd.Timestamp(value)
        return None if ts is pd.NaT else iso_z(ts)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, pd.Timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def canonical_json(value: Any, indent: int | None = None) -> str:
    """Deterministic JSON text: `to_jsonable`, sorted keys, no NaN."""
    return json.dumps(to_jsonable(value), sort_keys=True, indent=indent, ensure_ascii=False, allow_nan=False)
