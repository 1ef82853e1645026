"""Model registry and forecast store on a temporary warehouse."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from forecasting import registry

REGIONS = ("SE", "CISO")


@pytest.fixture
def store(tmp_warehouse, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return tmp_warehouse


@pytest.fixture(scope="module")
def frame(request) -> pd.DataFrame:
    try:
        shared = request.getfixturevalue("grid_frame")
        if set(REGIONS) <= set(shared["region"]) and shared["hour_utc"].min() <= pd.Timestamp("2021-05-01", tz="UTC") \
                and shared["hour_utc"].max() >= pd.Timestamp("2021-07-10", tz="UTC"):
            return shared[shared["region"].isin(REGIONS)].reset_index(drop=True)
    except pytest.FixtureLookupError:
        pass
    data_dir = request.getfixturevalue("data_dir")
    from forecasting.data import grid_hourly_from_files

    return grid_hourly_from_files(data_dir, REGIONS, start="2021-05-01", end="2021-07-10")


@pytest.fixture(scope="module")
def naive(frame):
    from forecasting.models.naive import SeasonalNaive

    return SeasonalNaive(period=24).fit(frame[frame["hour_utc"] < "2021-07-01"], "carbon_intensity")


def _tables(path) -> set[tuple[str, str]]:
    from warehouse.db import reader

    with reader(path) as con:
        return set(con.execute("SELECT table_schema, table_name FROM information_schema.tables").fetchall())


def test_tables_created_idempotently(store):
    from warehouse.db import writer

    for _ in range(2):
        with writer(store) as con:
            registry.ensure_tables(con)
    assert {("model", "registry"), ("forecast", "forecasts")} <= _tables(store)


def test_register_and_latest_good_roundtrip(store, naive, frame):
    first = registry.register_model(naive, "naive-24", "carbon_intensity", "2021-06-01", metrics={"mape": 7.5},
                                    params={"period": 24, "nan": float("nan")})
    second = registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01", metrics={"mape": 7.0})
    again = registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01", metrics={"mape": 6.9})
    failed = registry.register_model(None, "naive-24", "carbon_intensity", "2021-08-01", status="failed",
                                     metrics={"error": "boom"})
    assert first.version == "20210601T0000Z.1"
    assert (second.version, again.version) == ("20210701T0000Z.1", "20210701T0000Z.2")
    assert failed.status == "failed" and failed.artifact_path is None

    latest = registry.latest_good("naive-24", "carbon_intensity")
    assert latest.version == again.version  # the failed newer one is never returned
    assert latest.metrics == {"mape": 6.9}
    assert latest.trained_at == pd.Timestamp("2021-07-01", tz="UTC")
    # Replaying June: only the version whose cut-off is not after as_of.
    assert registry.latest_good("naive-24", "carbon_intensity", as_of="2021-06-15").version == first.version
    assert registry.latest_good("naive-24", "carbon_intensity", as_of="2021-05-01") is None
    assert registry.latest_good("naive-24", "solar") is None
    assert registry.get_version("naive-24", "carbon_intensity", first.version).params == {"period": 24, "nan": None}

    loaded = latest.load()
    issued = pd.Timestamp("2021-07-03T00:00Z")
    pd.testing.assert_frame_equal(loaded.predict(issued, 24, frame), naive.predict(issued, 24, frame))
    assert latest.artifact_path.endswith("naive-24/carbon_intensity/20210701T0000Z.2")
    manifest = json.loads((pd.io.common.Path(latest.artifact_path) / "artifact.json").read_text())
    assert manifest["format"] == "pickle" and "model.pkl" in manifest["files"]


def test_corrupted_or_missing_artifact_raises(store, naive):
    from pathlib import Path

    record = registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01")
    blob = Path(record.artifact_path) / "model.pkl"
    blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(registry.ArtifactError, match="corrupted"):
        record.load()
    blob.unlink()
    with pytest.raises(registry.ArtifactError, match="missing"):
        record.load()


def test_unknown_model_is_unavailable():
    with pytest.raises(registry.ModelUnavailable):
        registry.make_model("no-such-model")


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


def test_forecast_writes_are_idempotent_per_key(store):
    assert registry.write_forecasts(_rows("2021-07-01T00:00")) == 12
    assert registry.write_forecasts(_rows("2021-07-01T00:00")) == 12
    stored = registry.read_forecasts("prophet", "carbon_intensity")
    assert len(stored) == 12
    # Re-issuing with fewer hours replaces the whole (issued_at, region, target, model) block.
    registry.write_forecasts(_rows("2021-07-01T00:00", p50=200.0, hours=3))
    stored = registry.read_forecasts("prophet", "carbon_intensity")
    assert len(stored) == 6 and (stored["p50"] >= 200).all()
    # Other issues and models are untouched.
    registry.write_forecasts(_rows("2021-07-01T06:00"))
    registry.write_forecasts(_rows("2021-07-01T00:00", model="tft"))
    assert len(registry.read_forecasts()) == 6 + 12 + 12
    with pytest.raises(ValueError, match="repeat"):
        registry.write_forecasts(pd.concat([_rows("2021-07-02T00:00")] * 2))


def test_last_good_forecast_takes_latest_earlier_non_fallback(store):
    registry.write_forecasts(_rows("2021-07-01T00:00", p50=100.0, hours=12))
    registry.write_forecasts(_rows("2021-07-01T03:00", p50=300.0, hours=12))
    registry.write_forecasts(_rows("2021-07-01T04:00", p50=900.0, hours=12, fallback=True))
    registry.write_forecasts(_rows("2021-07-01T06:00", p50=600.0, hours=12))  # not before `before`
    rows = registry.last_good_forecast("prophet", "carbon_intensity", ["SE"], before="2021-07-01T05:00",
                                       target_from="2021-07-01T05:00", target_until="2021-07-01T20:00")
    assert rows["target_time"].min() == pd.Timestamp("2021-07-01T05:00Z")
    assert rows["target_time"].max() == pd.Timestamp("2021-07-01T14:00Z")  # issue 03:00 + 12 h
    assert (rows["issued_at"] == pd.Timestamp("2021-07-01T03:00Z")).all()
    assert (~rows["is_fallback"]).all() and (rows["region"] == "SE").all()
