"""Deterministic JSON: every kind of value a plan's records hold comes out as the same plain JSON."""

from __future__ import annotations

import math
from datetime import date

import numpy as np
import pandas as pd

from common.jsonutil import canonical_json, to_jsonable


def test_plain_and_numpy_values_become_plain_json():
    value = {
        "s": "x",
        "i": 3,
        "b": True,
        "f": 0.5,
        "nan": float("nan"),
        "inf": -math.inf,
        "none": None,
        2: "int key",
        "np": [np.int64(4), np.float32(0.25), np.bool_(False), np.float64("nan")],
        "t": pd.Timestamp("2021-07-15T02:00+02:00"),
        "d": date(2021, 7, 15),
        "td": pd.Timedelta(minutes=90),
        "tuple": (1, (2, 3)),
        "set": {"b", "a"},
        "arr": np.array([1.5, 2.5]),
        "na": pd.NA,
        "nat": pd.NaT,
        "other": complex(1, 2),
    }
    assert to_jsonable(value) == {
        "s": "x", "i": 3, "b": True, "f": 0.5, "nan": None, "inf": None, "none": None, "2": "int key",
        "np": [4, 0.25, False, None], "t": "2021-07-15T00:00:00Z", "d": "2021-07-15", "td": 5400.0,
        "tuple": [1, [2, 3]], "set": ["a", "b"], "arr": [1.5, 2.5], "na": None, "nat": None, "other": "(1+2j)",
    }  # fmt: skip
    assert type(to_jsonable(np.int64(4))) is int and type(to_jsonable(True)) is bool


def test_the_same_value_gives_the_same_text_whatever_the_key_order():
    a = {"b": [1, {"y": 2, "x": 1}], "a": 0.1}
    b = {"a": 0.1, "b": [1, {"x": 1, "y": 2}]}
    assert canonical_json(a) == canonical_json(b) == '{"a": 0.1, "b": [1, {"x": 1, "y": 2}]}'
