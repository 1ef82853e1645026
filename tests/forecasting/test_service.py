"""forecasting.service: train → model registry → predict → forecast store, fallbacks, idempotency."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pandas as pd
import pytest

from forecasting import service, store
from warehouse import model_registry

REGIONS = ("SE", "CISO")


@pytest.fixture(scope="module")
def frame(request) -> pd.DataFrame:
    try:
        shared = request.getfixturevalue("grid_frame")
        if (
            set(REGIONS) <= set(shared["region"])
            and shared["hour_utc"].min() <= pd.Timestamp("2021-03-01", tz="UTC")
            and shared["hour_utc"].max() >= pd.Timestamp("2021-07-20", tz="UTC")
        ):
            return shared[shared["region"].isin(REGIONS)].reset_index(drop=True)
    except pytest.FixtureLookupError:
        pass
    data_dir = request.getfixturevalue("data_dir")
    from forecasting.data import grid_hourly_from_files

    return grid_hourly_from_files(data_dir, REGIONS, start="2021-03-01", end="2021-07-20")


@pytest.fixture
def warehouse(tmp_warehouse, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return tmp_warehouse


@pytest.fixture
def trained(warehouse, frame):
    results = service.train(
        ["naive-24", "prophet", "no-such-model"],
        ["carbon_intensity"],
        REGIONS,
        "2021-06-30",
        budget_s=600,
        tiny=True,
        val_days=7,
        data=frame,
    )
    return {r.model: r for r in results}


def test_train_registers_versions_with_validation_metrics(trained):
    assert trained["no-such-model"].status == "skipped" and "no-such-model" in trained["no-such-model"].message
    for name in ("naive-24", "prophet"):
        result = trained[name]
        assert result.status == "good", result.message
        record = model_registry.latest_good(name, "carbon_intensity")
        assert record.version == result.version == "20210701T0000Z.1"
        assert record.trained_at == pd.Timestamp("2021-07-01", tz="UTC")  # the data cut-off, not the wall clock
        metrics = record.metrics
        assert metrics["window"] == ["2021-06-24T00:00:00+00:00", "2021-07-01T00:00:00+00:00"]
        assert 0 < metrics["mape"] < 50 and set(metrics["by_region"]) == set(REGIONS)
        assert metrics["n"] == 7 * 24 * len(REGIONS)
        assert record.params["tiny"] is True
    # The seasonal naive scored by the service equals its own inline baseline on the same hours.
    assert trained["naive-24"].metrics["mape"] == pytest.approx(trained["naive-24"].metrics["naive24_mape"], abs=1e-3)


def test_predict_is_idempotent(trained, frame, warehouse):
    as_of = "2021-07-05T12:00Z"
    rows1, summary = service.predict(as_of, 48, REGIONS, models=["naive-24", "prophet"], data=frame)
    stored1 = store.read_forecasts()
    rows2, _ = service.predict(as_of, 48, REGIONS, models=["naive-24", "prophet"], data=frame)
    stored2 = store.read_forecasts()
    assert len(rows1) == 2 * 48 * len(REGIONS) and not rows1["is_fallback"].any()
    assert {s.model: s.version for s in summary} == {"naive-24": "20210701T0000Z.1", "prophet": "20210701T0000Z.1"}
    pd.testing.assert_frame_equal(stored1, stored2)
    pd.testing.assert_frame_equal(rows1.reset_index(drop=True), rows2.reset_index(drop=True))
    assert (stored1["issued_at"] == pd.Timestamp(as_of)).all()


def test_predict_with_loaded_forecasters_loads_each_version_once(trained, frame, warehouse):
    """A caller's `loaded` dict keeps the forecasters between issues (one entry per model version, the same object
    the next issue uses); the first issue's rows equal those of a plain issue."""
    plain, _ = service.predict("2021-07-05T12:00Z", 24, REGIONS, models=["prophet"], data=frame, write=False)
    loaded: dict = {}
    first, _ = service.predict(
        "2021-07-05T12:00Z", 24, REGIONS, models=["prophet"], data=frame, write=False, loaded=loaded
    )
    assert list(loaded) == [("prophet", "carbon_intensity", "20210701T0000Z.1")]
    kept = loaded[("prophet", "carbon_intensity", "20210701T0000Z.1")]
    service.predict("2021-07-05T18:00Z", 24, REGIONS, models=["prophet"], data=frame, write=False, loaded=loaded)
    assert len(loaded) == 1 and loaded[("prophet", "carbon_intensity", "20210701T0000Z.1")] is kept
    pd.testing.assert_frame_equal(plain.reset_index(drop=True), first.reset_index(drop=True))


def test_fallback_on_corrupted_artifact_flags_rows(trained, frame, warehouse):
    earlier = pd.Timestamp("2021-07-05T00:00Z")
    before, _ = service.predict(earlier, 24, REGIONS, models=["prophet"], data=frame)
    record = model_registry.latest_good("prophet", "carbon_intensity")
    artifact = Path(record.artifact_path) / "prophet.pkl"
    artifact.write_bytes(b"not a pickle")

    later = pd.Timestamp("2021-07-05T06:00Z")
    rows, summary = service.predict(later, 24, REGIONS, models=["prophet"], data=frame)
    assert len(rows) == 24 * len(REGIONS)
    assert rows["is_fallback"].all()
    assert rows["fallback_reason"].str.contains("corrupted").all()
    reused = rows[rows["target_time"] < earlier + pd.Timedelta(hours=24)]
    naive = rows[rows["target_time"] >= earlier + pd.Timedelta(hours=24)]
    assert len(reused) == 18 * len(REGIONS) and len(naive) == 6 * len(REGIONS)
    assert reused["fallback_reason"].str.contains("last good forecast issued 2021-07-05T00:00:00").all()
    assert (naive["model_version"] == "naive-24").all()
    assert naive["fallback_reason"].str.contains("seasonal naive").all()
    merged = reused.merge(before, on=["region", "target_time"], suffixes=("", "_before"))
    assert (merged["p50"] == merged["p50_before"]).all()
    assert summary[0].fallback_rows == len(rows) and "corrupted" in summary[0].reasons[0]
    stored = store.read_forecasts("prophet", issued_at=later)
    assert stored["is_fallback"].all() and len(stored) == len(rows)


def test_model_without_version_falls_back_to_seasonal_naive(warehouse, frame):
    rows, summary = service.predict("2021-07-10T00:00Z", 24, REGIONS, models=["lgbm"], data=frame)
    assert len(rows) == 24 * len(REGIONS) and rows["is_fallback"].all()
    assert rows["fallback_reason"].str.contains("no good version of lgbm").all()
    assert (rows["model"] == "lgbm").all() and (rows["model_version"] == "naive-24").all()
    # The naive's point forecast: the same hour on the last known day.
    col = "carbon_intensity_direct_gco2_per_kwh"
    actual = frame.set_index(["region", "hour_utc"])[col]
    expected = [actual[(r, t - pd.Timedelta(hours=24))] for r, t in zip(rows["region"], rows["target_time"])]
    assert rows["p50"].round(6).tolist() == pd.Series(expected).round(6).tolist()


def test_predict_needs_explicit_as_of_and_a_model(warehouse, frame):
    with pytest.raises(ValueError, match="explicit as_of"):
        service.predict(None, 24, REGIONS, data=frame)
    with pytest.raises(ValueError, match="no good model"):
        service.predict("2021-07-10T00:00Z", 24, REGIONS, data=frame)


def test_predict_outside_the_data_says_so(warehouse, frame):
    """An hourly run at the wall-clock hour on a warehouse holding 2021 only: a clear error, not a pandas one."""
    with pytest.raises(ValueError, match="no grid data for .* before 2030-01-01T00:00:00"):
        service.predict("2030-01-01T00:00Z", 24, REGIONS, data=frame)


def test_budget_spent_skips_jobs(warehouse, frame):
    results = service.train(["naive-24"], ["carbon_intensity"], REGIONS, "2021-06-30", budget_s=0.5, data=frame)
    assert [r.status for r in results] == ["skipped"] and "budget" in results[0].message


def test_without_refit_the_validated_fit_keeps_its_own_cutoff(warehouse, frame):
    results = service.train(
        ["naive-24"], ["carbon_intensity"], REGIONS, "2021-06-30", val_days=7, data=frame, refit="never"
    )
    record = model_registry.latest_good("naive-24", "carbon_intensity")
    assert results[0].status == "good" and record.metrics["refit"] is False
    assert record.trained_at == pd.Timestamp("2021-06-24", tz="UTC")  # the data it saw ends where validation starts
    assert record.version == "20210624T0000Z.1"


def test_tft_trains_in_a_second_process(warehouse, frame):
    """`workers=2`: the TFT lane runs in its own process and registers its version in the same warehouse."""
    results = service.train(
        ["naive-24", "tft"],
        ["carbon_intensity"],
        REGIONS,
        "2021-06-30",
        budget_s=300,
        tiny=True,
        val_days=7,
        data=frame,
        workers=2,
    )
    assert [(r.model, r.status) for r in results] == [("naive-24", "good"), ("tft", "good")]
    record = model_registry.latest_good("tft", "carbon_intensity")
    assert record.version == results[1].version and record.metrics["n"] == 7 * 24 * len(REGIONS)
    rows, _ = service.predict("2021-07-02T00:00Z", 24, REGIONS, models=["tft"], data=frame)
    assert len(rows) == 24 * len(REGIONS) and not rows["is_fallback"].any()


def test_models_that_do_not_forecast_a_target_are_not_trained_for_it(warehouse, frame):
    """The mix composite forecasts carbon intensity only: no failed 'mix/wind' version lands in the registry."""
    results = service.train(["mix"], ["wind"], REGIONS, "2021-06-30", budget_s=60, tiny=True, val_days=7, data=frame)
    assert results == []
    assert model_registry.list_models("mix", "wind", db_path=warehouse) == []
