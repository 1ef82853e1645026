"""The forecast store (forecasting.store) on a temporary warehouse: idempotent writes, reads, last good forecast."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting import store

REGIONS = ("SE", "CISO")


@pytest.fixture
def warehouse(tmp_warehouse):
    return tmp_warehouse


def _tables(path) -> set[tuple[str, str]]:
    from warehouse.db import reader

    with reader(path) as con:
        return set(con.execute("SELECT table_schema, table_name FROM information_schema.tables").fetchall())


def test_tables_created_idempotently(warehouse):
    from warehouse.db import writer

    for _ in range(2):
        with writer(warehouse) as con:
            store.ensure_tables(con)
    assert ("forecast", "forecasts") in _tables(warehouse)


def _rows(issued: str, model: str = "prophet", p50: float = 100.0, hours: int = 6, fallback: bool = False):
    issued_at = pd.Timestamp(issued, tz="UTC")
    out = []
    for region in REGIONS:
        out.append(
            pd.DataFrame(
                {
                    "issued_at": issued_at,
                    "target_time": pd.date_range(issued_at, periods=hours, freq="h"),
                    "region": region,
                    "target": "carbon_intensity",
                    "p10": p50 - 10,
                    "p50": p50 + np.arange(hours),
                    "p90": p50 + 10 + np.arange(hours),
                    "model": model,
                    "model_version": "v1",
                    "is_fallback": fallback,
                    "fallback_reason": "test" if fallback else None,
                }
            )
        )
    return pd.concat(out, ignore_index=True)


def test_forecast_writes_are_idempotent_per_key(warehouse):
    assert store.write_forecasts(_rows("2021-07-01T00:00")) == 12
    assert store.write_forecasts(_rows("2021-07-01T00:00")) == 12
    stored = store.read_forecasts("prophet", "carbon_intensity")
    assert len(stored) == 12
    # Re-issuing with fewer hours replaces the whole (issued_at, region, target, model) block.
    store.write_forecasts(_rows("2021-07-01T00:00", p50=200.0, hours=3))
    stored = store.read_forecasts("prophet", "carbon_intensity")
    assert len(stored) == 6 and (stored["p50"] >= 200).all()
    # Other issues and models are untouched.
    store.write_forecasts(_rows("2021-07-01T06:00"))
    store.write_forecasts(_rows("2021-07-01T00:00", model="tft"))
    assert len(store.read_forecasts()) == 6 + 12 + 12
    with pytest.raises(ValueError, match="repeat"):
        store.write_forecasts(pd.concat([_rows("2021-07-02T00:00")] * 2))


def test_last_good_forecast_takes_latest_earlier_non_fallback(warehouse):
    store.write_forecasts(_rows("2021-07-01T00:00", p50=100.0, hours=12))
    store.write_forecasts(_rows("2021-07-01T03:00", p50=300.0, hours=12))
    store.write_forecasts(_rows("2021-07-01T04:00", p50=900.0, hours=12, fallback=True))
    store.write_forecasts(_rows("2021-07-01T06:00", p50=600.0, hours=12))  # not before `before`
    rows = store.last_good_forecast(
        "prophet",
        "carbon_intensity",
        ["SE"],
        before="2021-07-01T05:00",
        target_from="2021-07-01T05:00",
        target_until="2021-07-01T20:00",
    )
    assert rows["target_time"].min() == pd.Timestamp("2021-07-01T05:00Z")
    assert rows["target_time"].max() == pd.Timestamp("2021-07-01T14:00Z")  # issue 03:00 + 12 h
    assert (rows["issued_at"] == pd.Timestamp("2021-07-01T03:00Z")).all()
    assert (~rows["is_fallback"]).all() and (rows["region"] == "SE").all()
