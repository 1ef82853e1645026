"""Parsing and unit conversion of each API, against the recorded payloads served over HTTP."""

from __future__ import annotations

import base64

import pandas as pd
import pytest

from tests.connectors.conftest import EIA_KEY, EIA_PATH, EM_KEY, END, START, WT_PASSWORD, WT_TOKEN, WT_USER, payload
from warehouse.connectors.eia930 import DIRECT_FACTORS, LIFECYCLE_FACTORS
from warehouse.connectors.schema import CARBON_INTENSITY, COLUMNS, GENERATION, GENERATION_SHARE, LIVE_FORECASTS
from warehouse.connectors.watttime import LBS_PER_MWH_TO_G_PER_KWH

S, E = pd.Timestamp(START), pd.Timestamp(END)


def _hour(h: int) -> pd.Timestamp:
    return S + pd.Timedelta(hours=h)


def test_lbs_per_mwh_conversion_factor():
    assert LBS_PER_MWH_TO_G_PER_KWH == pytest.approx(453.59237 / 1000)


# -- Electricity Maps ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["past-range", "history"])
def test_electricitymaps_carbon_intensity_and_breakdown(api, feeds, mode):
    feeds.config = feeds.config.with_options("electricitymaps", mode=mode)
    data = feeds.connector("electricitymaps").fetch("DE", "DE", S, E)
    ci = data.frames[CARBON_INTENSITY]
    assert list(ci.columns) == list(COLUMNS[CARBON_INTENSITY])
    assert ci["carbon_intensity_gco2_per_kwh"].tolist() == [312, 305, 301, 298, 306, 321]
    assert set(ci["signal_type"]) == {"average"} and set(ci["basis"]) == {"consumption"}
    assert set(ci["scope"]) == {"lifecycle"}  # the payload's emissionFactorType
    assert set(ci["data_source"]) == {"electricitymaps"} and set(ci["region"]) == {"DE"}
    assert ci.loc[ci["hour_utc"] == _hour(4), "quality_flag"].item() == "estimated"
    assert ci.loc[ci["hour_utc"] != _hour(4), "quality_flag"].isna().all()
    assert str(ci["hour_utc"].dtype) == "datetime64[us, UTC]"

    gen = data.frames[GENERATION]
    assert set(gen["fuel"]) == {
        "nuclear",
        "geothermal",
        "biomass",
        "coal",
        "wind",
        "solar",
        "hydro",
        "nat_gas",
        "oil",
        "unknown",
    }
    first = gen[gen["hour_utc"] == _hour(0)].set_index("fuel")["generation_mw"]
    assert first["nat_gas"] == 5230.0 and first["coal"] == 14930.0  # gas -> nat_gas, MW as given
    assert "hydro discharge" not in set(gen["fuel"])  # storage is not generation

    calls = api.calls(f"/v3/carbon-intensity/{mode}")
    assert calls and all(c.headers.get("auth-token") == EM_KEY for c in calls)
    assert calls[0].param("zone") == "DE" and calls[0].param("emissionFactorType") == "lifecycle"
    if mode == "past-range":
        assert calls[0].param("start") == "2021-07-01T00:00:00Z" and calls[0].param("end") == "2021-07-01T06:00:00Z"


def test_electricitymaps_long_interval_is_split_into_ten_day_requests(api, feeds):
    feeds.connector("electricitymaps").fetch("DE", "DE", S, S + pd.Timedelta(days=25))
    calls = api.calls("/v3/carbon-intensity/past-range")
    assert [(c.param("start"), c.param("end")) for c in calls] == [
        ("2021-07-01T00:00:00Z", "2021-07-11T00:00:00Z"),
        ("2021-07-11T00:00:00Z", "2021-07-21T00:00:00Z"),
        ("2021-07-21T00:00:00Z", "2021-07-26T00:00:00Z"),
    ]


def test_electricitymaps_direct_scope_follows_the_payload(api, feeds):
    def direct(request):
        body = payload("electricitymaps_carbon_intensity_past_range_DE.json")
        for row in body["data"]:
            row["emissionFactorType"] = request.param("emissionFactorType")
        return 200, body

    api.route("/v3/carbon-intensity/past-range", direct)
    feeds.config = feeds.config.with_options("electricitymaps", emission_factor_type="direct")
    ci = feeds.connector("electricitymaps").fetch("DE", "DE", S, E).frames[CARBON_INTENSITY]
    assert set(ci["scope"]) == {"direct"}


def test_electricitymaps_null_and_bad_rows_are_quarantined(api, feeds):
    def broken(request):
        body = payload("electricitymaps_carbon_intensity_past_range_DE.json")
        body["data"][1]["carbonIntensity"] = None
        body["data"][2]["datetime"] = "yesterday-ish"
        return 200, body

    api.route("/v3/carbon-intensity/past-range", broken)
    data = feeds.connector("electricitymaps").fetch("DE", "DE", S, E)
    assert len(data.frames[CARBON_INTENSITY]) == 4
    reasons = sorted(r.reason for r in data.rejections[CARBON_INTENSITY])
    assert reasons == ["carbonIntensity is null", "datetime is not a timestamp"]
    assert all(r.row_number in (2, 3) and r.file == "electricitymaps:DE" for r in data.rejections[CARBON_INTENSITY])


# -- WattTime --------------------------------------------------------------------------------------------------
def test_watttime_login_then_bearer_and_lbs_to_grams(api, feeds):
    data = feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    login = api.calls("/login")
    assert len(login) == 1
    assert (
        login[0].headers["Authorization"] == "Basic " + base64.b64encode(f"{WT_USER}:{WT_PASSWORD}".encode()).decode()
    )
    hist = api.calls("/v3/historical")[0]
    assert hist.headers["Authorization"] == f"Bearer {WT_TOKEN}"
    assert (hist.param("region"), hist.param("signal_type")) == ("CAISO_NORTH", "co2_moer")
    assert (pd.Timestamp(hist.param("start")), pd.Timestamp(hist.param("end"))) == (S, E)  # the SDK's format

    ci = data.frames[CARBON_INTENSITY]
    assert len(ci) == 6
    assert set(zip(ci["signal_type"], ci["basis"], ci["scope"])) == {("marginal", "production", "direct")}
    points = pd.DataFrame(payload("watttime_historical_CAISO_NORTH.json")["data"])
    points["hour"] = pd.to_datetime(points["point_time"], utc=True).dt.floor("h")
    expected = points.groupby("hour")["value"].mean() * 0.45359237
    assert ci.set_index("hour_utc")["carbon_intensity_gco2_per_kwh"].to_numpy() == pytest.approx(expected.to_numpy())
    assert ci.loc[ci["hour_utc"] == _hour(3), "quality_flag"].item() == "partial_hour"  # 10 of 12 points
    assert ci.loc[ci["hour_utc"] != _hour(3), "quality_flag"].isna().all()


def test_watttime_token_is_renewed_once_on_401(api, feeds):
    from tests.connectors.conftest import sequence

    api.route(
        "/v3/historical",
        sequence((401, {"error": "token expired"}), (200, payload("watttime_historical_CAISO_NORTH.json"))),
    )
    data = feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    assert len(data.frames[CARBON_INTENSITY]) == 6
    assert api.count("/login") == 2 and api.count("/v3/historical") == 2


def test_watttime_forecast_keeps_issued_time(api, feeds):
    data = feeds.connector("watttime").forecast("CISO", "CAISO_NORTH", E)
    fc = data.frames[LIVE_FORECASTS]
    assert list(fc.columns) == list(COLUMNS[LIVE_FORECASTS])
    assert set(fc["issued_at"]) == {pd.Timestamp("2021-07-01T06:00:00Z")}
    assert fc["hour_utc"].tolist() == [_hour(6), _hour(7), _hour(8)]
    first = [p["value"] for p in payload("watttime_forecast_CAISO_NORTH.json")["data"][:12]]
    assert fc["carbon_intensity_gco2_per_kwh"].iloc[0] == pytest.approx(sum(first) / 12 * 0.45359237)
    assert set(fc["signal_type"]) == {"marginal"}
    call = api.calls("/v3/forecast")[0]
    assert call.param("horizon_hours") == "24"


def test_watttime_historical_forecast_is_the_one_known_at_as_of(api, feeds):
    feeds.config = feeds.config.with_options("watttime", forecast_mode="historical")
    fc = feeds.connector("watttime").forecast("CISO", "CAISO_NORTH", E).frames[LIVE_FORECASTS]
    # the run issued at 06:05 is after as_of=06:00 and must not be used
    assert set(fc["issued_at"]) == {pd.Timestamp("2021-07-01T06:00:00Z")}
    call = api.calls("/v3/forecast/historical")[0]
    assert (pd.Timestamp(call.param("start")), pd.Timestamp(call.param("end"))) == (E - pd.Timedelta(hours=1), E)


def test_watttime_unknown_units_fail_clearly(api, feeds):
    body = payload("watttime_historical_CAISO_NORTH.json")
    body["meta"]["units"] = "percentile"
    api.route("/v3/historical", lambda request: (200, body))
    from warehouse.connectors.http import PayloadError

    with pytest.raises(PayloadError, match="meta.units 'percentile'"):
        feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)


# -- UK Carbon Intensity ---------------------------------------------------------------------------------------
def test_ukci_half_hours_become_hours(api, feeds):
    data = feeds.connector("ukci").fetch("GB", "GB", S, E)
    assert [c.path for c in api.calls("/intensity/")] == ["/intensity/2021-07-01T00:00Z/2021-07-01T06:00Z"]
    assert not any("key" in c.query for c in api.requests)  # no key for this API
    ci = data.frames[CARBON_INTENSITY]
    assert ci["hour_utc"].tolist() == [_hour(h) for h in range(6)]  # 23:30 half-hour of the day before dropped
    assert ci["carbon_intensity_gco2_per_kwh"].tolist()[:5] == [171.5, 177.5, 183.5, 189.5, 195.5]  # mean of 2
    assert ci["carbon_intensity_gco2_per_kwh"].iloc[5] == 200.0  # 05:30 has no actual yet: only 05:00
    assert ci["quality_flag"].iloc[:5].isna().all()
    assert ci["quality_flag"].iloc[5] == "partial_hour"
    assert set(zip(ci["signal_type"], ci["basis"], ci["scope"])) == {("average", "consumption", "direct")}

    share = data.frames[GENERATION_SHARE]
    assert list(share.columns) == list(COLUMNS[GENERATION_SHARE])
    assert set(share["fuel"]) == {"biomass", "coal", "imports", "nat_gas", "nuclear", "other", "hydro", "solar", "wind"}
    totals = share.groupby("hour_utc")["share_pct"].sum()
    assert totals.to_numpy() == pytest.approx([100.0] * 6, abs=0.2)
    gas0 = share[(share["hour_utc"] == _hour(0)) & (share["fuel"] == "nat_gas")]["share_pct"].item()
    assert gas0 == pytest.approx((38.2 + 38.5) / 2)
    assert GENERATION not in data.frames  # percent only: no MW without a total


# -- EIA-930 ---------------------------------------------------------------------------------------------------
def test_eia930_pages_and_derives_intensity(api, feeds):
    data = feeds.connector("eia930").fetch("CISO", "CISO", S, E)
    calls = api.calls(EIA_PATH)
    assert [c.param("offset") for c in calls] == ["0", "30"]  # two pages, then total reached
    first = calls[0]
    assert first.param("api_key") == EIA_KEY and first.param("length") == "30"
    assert (first.param("frequency"), first.param("data[0]"), first.param("facets[respondent][]")) == (
        "hourly",
        "value",
        "CISO",
    )
    assert (first.param("start"), first.param("end")) == ("2021-07-01T01", "2021-07-01T06")  # hour-ending periods

    gen = data.frames[GENERATION]
    assert list(gen.columns) == list(COLUMNS[GENERATION])
    assert gen["hour_utc"].min() == _hour(0) and gen["hour_utc"].max() == _hour(5)  # period T01 = hour 00:00
    assert len(gen) == 6 * 8 - 1  # 8 fuels, one null value quarantined, battery rows left out
    assert set(gen["fuel"]) == {"coal", "nat_gas", "nuclear", "oil", "other", "solar", "hydro", "wind"}
    h0 = gen[gen["hour_utc"] == _hour(0)].set_index("fuel")["generation_mw"]
    assert h0["solar"] == 9480 and h0["nat_gas"] == 7120 and h0["nuclear"] == 2253
    [rejected] = data.rejections[GENERATION]
    assert (
        rejected.field == "value"
        and rejected.record["fueltype"] == "OIL"
        and rejected.record["period"] == "2021-07-01T03"
    )

    ci = data.frames[CARBON_INTENSITY]
    assert set(zip(ci["scope"], ci["basis"], ci["signal_type"])) == {
        ("direct", "production", "average"),
        ("lifecycle", "production", "average"),
    }
    assert set(ci["quality_flag"]) == {"recomputed_from_mix"}
    for scope, factors in (("direct", DIRECT_FACTORS), ("lifecycle", LIFECYCLE_FACTORS)):
        expected = sum(h0[f] * factors[f] for f in h0.index) / h0.sum()
        got = ci[(ci["hour_utc"] == _hour(0)) & (ci["scope"] == scope)]["carbon_intensity_gco2_per_kwh"].item()
        assert got == pytest.approx(expected)
    assert DIRECT_FACTORS["nat_gas"] == 370.0 and LIFECYCLE_FACTORS["coal"] == 820.0  # the file loader's table


def test_eia930_short_page_is_an_error(api, feeds):
    def short(request):
        body = payload("eia930_fuel_type_data_CISO_page1.json")
        if request.param("offset") != "0":
            body["response"]["data"] = []
        return 200, body

    api.route(EIA_PATH, short)
    from warehouse.connectors.http import PayloadError

    with pytest.raises(PayloadError, match="got 30 of response.total=50"):
        feeds.connector("eia930").fetch("CISO", "CISO", S, E)
