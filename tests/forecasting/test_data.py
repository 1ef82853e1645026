"""The grid frame built from the files, the published forecasts and their availability rule, masking."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting import data as fdata
from forecasting.base import known_at


def test_frame_has_the_mart_columns(grid_frame):
    assert list(grid_frame.columns[: len(fdata.GRID_HOURLY_COLUMNS)]) == list(fdata.GRID_HOURLY_COLUMNS)
    assert set(grid_frame["region"]) == {"CISO", "DE"}
    assert not grid_frame.duplicated(["region", "hour_utc"]).any()
    assert str(grid_frame["hour_utc"].dt.tz) == "UTC"
    assert grid_frame["signal_type"].eq("average").all() and grid_frame["basis"].eq("production").all()


def test_de_generation_scaled_and_ci_recomputed(grid_frame):
    de = grid_frame[grid_frame["region"] == "DE"]
    assert de["generation_scaled"].all() and de["ci_recomputed_from_mix"].all()
    # ÷4: German nuclear was ~4 GW in early 2021 (8 GW before the end-2021 closures), not 16–32 GW.
    assert 3000 < de["nuclear_mw"].mean() < 9000
    recomputed = fdata.compose_intensity(de, fdata.DIRECT_FACTORS)
    assert np.allclose(recomputed, de["carbon_intensity_direct_gco2_per_kwh"], atol=0.01)
    # The lifecycle file is the source's "direct" file for DE: lifecycle must be larger than direct.
    assert (de["carbon_intensity_lifecycle_gco2_per_kwh"] > de["carbon_intensity_direct_gco2_per_kwh"]).mean() > 0.99


def test_de_direct_matches_dacf_actuals(grid_dir):
    frame = fdata.grid_hourly_from_files(grid_dir, ["DE"], start="2021-07-01", end="2021-08-01")
    pub = fdata.load_published_forecasts(["DE"], source="files", data_dir=grid_dir)
    actual = pub[pub["target"] == "carbon_intensity_actual"][["hour_utc", "value"]]
    merged = frame.merge(actual, on="hour_utc")
    assert len(merged) == 31 * 24
    assert (merged["carbon_intensity_direct_gco2_per_kwh"] - merged["value"]).abs().mean() < 0.01


def test_weather_is_aligned_to_its_valid_hour(grid_frame):
    # The files label each forecast one day early; after the shift, daily wind speed tracks daily DE wind output
    # better than the unshifted series does.
    de = grid_frame[grid_frame["region"] == "DE"].set_index("hour_utc")
    daily = de[["wind_mw", "wind_speed_m_per_s"]].resample("D").mean()
    aligned = daily["wind_mw"].corr(daily["wind_speed_m_per_s"])
    unshifted = daily["wind_mw"].corr(daily["wind_speed_m_per_s"].shift(-1))
    assert aligned > 0.8 and aligned > unshifted + 0.1


def test_calendar_columns(grid_frame):
    row = grid_frame.iloc[0]
    assert row["hour_utc"] == pd.Timestamp("2021-01-01", tz="UTC")
    assert (row["hour_of_day"], row["day_of_week"], row["month"], row["day_of_year"]) == (0, 4, 1, 1)
    assert not row["is_weekend"]


def test_mask_known_equals_known_at_and_is_idempotent(grid_frame):
    T = pd.Timestamp("2021-03-10", tz="UTC")
    expected = known_at(grid_frame, T)
    got = fdata.mask_known(grid_frame, T)
    for col in grid_frame.columns:
        assert expected[col].equals(got[col]), col
    again = fdata.mask_known(got, T)
    assert again is got  # flagged as masked at T: no work, same result
    assert got.loc[got["hour_utc"] >= T, "carbon_intensity_direct_gco2_per_kwh"].isna().all()
    assert got.loc[got["hour_utc"] >= T, "wind_speed_m_per_s"].notna().all()


def test_published_forecasts_from_files(grid_dir):
    pub = fdata.load_published_forecasts(["CISO", "DE", "PJM"], source="files", data_dir=grid_dir)
    assert set(pub.columns) == {"region", "hour_utc", "target", "value", "unit", "publisher", "data_source"}
    ops = pub.drop_duplicates(["region", "target", "publisher"])
    pubs = {(r, t): p for r, t, p in zip(ops["region"], ops["target"], ops["publisher"])}
    assert pubs[("CISO", "solar_mw")] == "CAISO OASIS" and pubs[("DE", "wind_mw")] == "ENTSO-E"
    assert pubs[("PJM", "wind_mw")] == "DACF"  # DACF's own ANN, not the operator
    de_wind = pub[(pub["region"] == "DE") & (pub["target"] == "wind_mw")]["value"]
    assert de_wind.mean() < 30000  # ÷4 applied (the file holds 4× MW)


def test_published_known_until_follows_the_markets():
    T = pd.Timestamp("2021-07-01 00:00", tz="UTC")
    # CAISO publishes the Pacific day ahead at ~13:00 PT: at 00:00 UTC (17:00 PDT) the next Pacific day is out.
    assert fdata.published_known_until(T, "CISO") == pd.Timestamp("2021-07-02 07:00", tz="UTC")
    # ENTSO-E by 18:00 Brussels: at 02:00 CEST only the running CET day (to 22:00 UTC) is published.
    assert fdata.published_known_until(T, "DE") == pd.Timestamp("2021-07-01 22:00", tz="UTC")
    assert fdata.published_known_until(pd.Timestamp("2021-12-01", tz="UTC"), "SE") == pd.Timestamp(
        "2021-12-01 23:00", tz="UTC"
    )
    assert fdata.published_known_until(pd.Timestamp("2021-07-01 17:00", tz="UTC"), "DE") == pd.Timestamp(
        "2021-07-02 22:00", tz="UTC"
    )


def test_attach_published_uses_operator_series_only_and_masks_by_publication(summer_frame):
    de = summer_frame[summer_frame["region"] == "DE"]
    assert de.loc[de["hour_utc"] >= "2021-07-01", "published_wind_mw"].notna().all()
    assert de.loc[de["hour_utc"] < "2021-07-01", "published_wind_mw"].isna().all()
    T = pd.Timestamp("2021-07-10", tz="UTC")
    masked = fdata.mask_known(summer_frame, T)
    m = masked[masked["region"] == "DE"].set_index("hour_utc")["published_wind_mw"]
    assert m[pd.Timestamp("2021-07-10 21:00", tz="UTC")] == pytest.approx(
        de.set_index("hour_utc")["published_wind_mw"][pd.Timestamp("2021-07-10 21:00", tz="UTC")]
    )
    assert np.isnan(m[pd.Timestamp("2021-07-10 22:00", tz="UTC")])
    c = masked[masked["region"] == "CISO"].set_index("hour_utc")["published_solar_mw"]
    assert np.isfinite(c[pd.Timestamp("2021-07-11 06:00", tz="UTC")])
    assert np.isnan(c[pd.Timestamp("2021-07-11 07:00", tz="UTC")])


def test_load_from_the_warehouse_round_trip(grid_frame, grid_dir, tmp_warehouse):
    """load_grid_hourly / load_published_forecasts read the mart and the raw table through warehouse.db.reader."""
    from warehouse.db import writer

    frame = grid_frame[grid_frame["hour_utc"] < "2021-01-15"]
    published = fdata.load_published_forecasts(["DE"], source="files", data_dir=grid_dir).head(500)
    with writer(tmp_warehouse) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS marts")
        con.register("f", frame)
        con.execute("CREATE TABLE marts.grid_hourly AS SELECT * FROM f")
        con.register("p", published)
        con.execute("CREATE TABLE raw.grid_published_forecasts AS SELECT * FROM p")
    got = fdata.load_grid_hourly(["DE"], start="2021-01-02", end="2021-01-03", db_path=tmp_warehouse)
    assert list(got.columns[: len(fdata.GRID_HOURLY_COLUMNS)]) == list(fdata.GRID_HOURLY_COLUMNS)
    assert len(got) == 24 and set(got["region"]) == {"DE"}
    want = frame[(frame["region"] == "DE") & (frame["hour_utc"] >= "2021-01-02") & (frame["hour_utc"] < "2021-01-03")]
    assert np.allclose(got["carbon_intensity_direct_gco2_per_kwh"], want["carbon_intensity_direct_gco2_per_kwh"])
    assert str(got["hour_utc"].dt.tz) == "UTC"
    assert fdata.grid_hourly(["DE"], db_path=tmp_warehouse).shape[0] == (frame["region"] == "DE").sum()
    pub = fdata.load_published_forecasts(["DE"], source="warehouse", db_path=tmp_warehouse)
    assert len(pub) == 500 and set(pub.columns) >= {"region", "hour_utc", "target", "value", "publisher"}


def test_a_marginal_signal_in_the_mart_is_refused(grid_frame, tmp_warehouse):
    """The training target is the average signal: a marginal row there fails loudly, with no fallback to files."""
    from warehouse.db import writer

    frame = grid_frame[grid_frame["hour_utc"] < "2021-01-03"].copy()
    frame.loc[frame.index[:3], "signal_type"] = "marginal"
    with writer(tmp_warehouse) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS marts")
        con.register("f", frame)
        con.execute("CREATE TABLE marts.grid_hourly AS SELECT * FROM f")
    with pytest.raises(fdata.SignalMixError, match=r"signal_type \['marginal'\].*3 rows"):
        fdata.load_grid_hourly(db_path=tmp_warehouse)
    with pytest.raises(fdata.SignalMixError):
        fdata.grid_hourly(source="auto", db_path=tmp_warehouse)


def test_known_at_blanks_boolean_and_integer_observed_columns():
    """pandas 3 refuses a missing value in a numpy bool column; known_at must still mask it (quality flags)."""
    hours = pd.date_range("2021-01-01", periods=4, freq="h", tz="UTC")
    data = pd.DataFrame({"region": "DE", "hour_utc": hours, "flag": [True, False, True, True], "count": [1, 2, 3, 4]})
    masked = known_at(data, hours[2])
    assert masked["flag"].iloc[:2].tolist() == [True, False]
    assert masked["flag"].iloc[2:].isna().all() and masked["count"].iloc[2:].isna().all()
    assert data["flag"].dtype == bool  # the input is untouched
