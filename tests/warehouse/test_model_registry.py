"""The model registry (warehouse.model_registry) on a temporary warehouse: versions, artifacts, checksums."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from warehouse import model_registry

REGIONS = ("SE", "CISO")


@pytest.fixture
def store(tmp_warehouse, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return tmp_warehouse


@pytest.fixture(scope="module")
def frame(request) -> pd.DataFrame:
    try:
        shared = request.getfixturevalue("grid_frame")
        if (
            set(REGIONS) <= set(shared["region"])
            and shared["hour_utc"].min() <= pd.Timestamp("2021-05-01", tz="UTC")
            and shared["hour_utc"].max() >= pd.Timestamp("2021-07-10", tz="UTC")
        ):
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
            model_registry.ensure_tables(con)
    assert ("model", "registry") in _tables(store)


def test_register_and_latest_good_roundtrip(store, naive, frame):
    first = model_registry.register_model(
        naive,
        "naive-24",
        "carbon_intensity",
        "2021-06-01",
        metrics={"mape": 7.5},
        params={"period": 24, "nan": float("nan")},
    )
    second = model_registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01", metrics={"mape": 7.0})
    again = model_registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01", metrics={"mape": 6.9})
    failed = model_registry.register_model(
        None, "naive-24", "carbon_intensity", "2021-08-01", status="failed", metrics={"error": "boom"}
    )
    assert first.version == "20210601T0000Z.1"
    assert (second.version, again.version) == ("20210701T0000Z.1", "20210701T0000Z.2")
    assert failed.status == "failed" and failed.artifact_path is None

    latest = model_registry.latest_good("naive-24", "carbon_intensity")
    assert latest.version == again.version  # the failed newer one is never returned
    assert latest.metrics == {"mape": 6.9}
    assert latest.trained_at == pd.Timestamp("2021-07-01", tz="UTC")
    # Replaying June: only the version whose cut-off is not after as_of.
    assert model_registry.latest_good("naive-24", "carbon_intensity", as_of="2021-06-15").version == first.version
    assert model_registry.latest_good("naive-24", "carbon_intensity", as_of="2021-05-01") is None
    assert model_registry.latest_good("naive-24", "solar") is None
    got = model_registry.get_version("naive-24", "carbon_intensity", first.version)
    assert got.params == {"period": 24, "nan": None}

    loaded = latest.load()
    issued = pd.Timestamp("2021-07-03T00:00Z")
    pd.testing.assert_frame_equal(loaded.predict(issued, 24, frame), naive.predict(issued, 24, frame))
    assert latest.artifact_path.endswith("naive-24/carbon_intensity/20210701T0000Z.2")
    manifest = json.loads((pd.io.common.Path(latest.artifact_path) / "artifact.json").read_text())
    assert manifest["format"] == "pickle" and "model.pkl" in manifest["files"]


def test_corrupted_or_missing_artifact_raises(store, naive):
    from pathlib import Path

    record = model_registry.register_model(naive, "naive-24", "carbon_intensity", "2021-07-01")
    blob = Path(record.artifact_path) / "model.pkl"
    blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(model_registry.ArtifactError, match="corrupted"):
        record.load()
    blob.unlink()
    with pytest.raises(model_registry.ArtifactError, match="missing"):
        record.load()
