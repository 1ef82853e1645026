"""ENTSO-E through entsoe-py against the local server: parsing, units, errors, failover, and a real DE day."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from tests.connectors.conftest import END, ENTSOE_KEY, ENTSOE_PATH, START, sequence
from tests.connectors.entsoe_documents import (
    DE_EIC,
    Series,
    acknowledgement,
    de_sample,
    gl_market_document,
    no_matching_data,
)
from warehouse.connectors.entsoe import PSR_FUELS
from warehouse.connectors.http import (
    HttpStatusError,
    MissingCredentialError,
    PayloadError,
    RateLimitedError,
    TransportError,
)
from warehouse.connectors.schema import CARBON_INTENSITY, COLUMNS, GENERATION
from warehouse.loaders.grid_factors import CARBONCAST_DIRECT, intensity_from_mix

S, E = pd.Timestamp(START), pd.Timestamp(END)
XML = {"Content-Type": "application/xml"}


def _hour(h: int) -> pd.Timestamp:
    return S + pd.Timedelta(hours=h)


def _de(series=None) -> str:
    return gl_market_document(DE_EIC, S, E, de_sample(S, E) if series is None else series)


# -- parsing -----------------------------------------------------------------------------------------------------
def test_request_parameters_come_from_the_library(api, feeds):
    feeds.connector("entsoe").fetch("DE", "DE", S, E)
    [call] = api.calls(ENTSOE_PATH)
    assert call.param("documentType") == "A75" and call.param("processType") == "A16"
    assert call.param("in_Domain") == DE_EIC and call.param("securityToken") == ENTSOE_KEY
    # 24 h before the interval show which types report (partial_mix); only [start, end) is kept
    assert (call.param("periodStart"), call.param("periodEnd")) == ("202106300000", "202107010600")
    headers = {name.lower(): value for name, value in call.headers.items()}
    assert headers["user-agent"].startswith("entsoe-py 0.8.1")


def test_generation_is_hourly_mean_mw_by_fuel(api, feeds):
    data = feeds.connector("entsoe").fetch("DE", "DE", S, E)
    gen = data.frames[GENERATION]
    assert list(gen.columns) == list(COLUMNS[GENERATION])
    assert set(gen["fuel"]) == {"biomass", "coal", "nat_gas", "nuclear", "solar", "wind", "unknown"}
    assert gen["hour_utc"].tolist()[0] == _hour(0) and gen["hour_utc"].max() == _hour(5)
    h0 = gen[gen["hour_utc"] == _hour(0)].set_index("fuel")["generation_mw"]
    lignite = np.mean([12000 + 40 * i for i in range(4)])
    hard_coal = np.mean([3100 - 8 * i for i in range(4)])
    assert h0["coal"] == pytest.approx(lignite + hard_coal)  # B02 + B05, each the mean of its four quarters
    assert h0["nat_gas"] == pytest.approx(5215.0)  # 5200, 5210, 5220, 5230
    assert h0["wind"] == pytest.approx(np.mean([14000 - 100 * i for i in range(4)]) + 3000)  # PT15M on + PT60M off
    assert h0["nuclear"] == 8100 and h0["unknown"] == 250  # B20 Other -> unknown
    assert "hydro" not in set(gen["fuel"])  # pumped storage (B10) is storage, its pumping is consumption
    h3 = gen[gen["hour_utc"] == _hour(3)].set_index("fuel")
    lignite3 = np.mean([12000 + 40 * i for i in (12, 13, 15)])  # 03:30 is missing: mean of the three points
    assert h3.loc["coal", "generation_mw"] == pytest.approx(lignite3 + np.mean([3100 - 8 * i for i in range(12, 16)]))
    assert h3.loc["coal", "quality_flag"] == "partial_hour"
    assert gen.loc[gen["hour_utc"] != _hour(3), "quality_flag"].isna().all()
    assert not data.rejections


def test_intensity_is_recomputed_from_the_mix_with_the_file_factors(api, feeds):
    data = feeds.connector("entsoe").fetch("DE", "DE", S, E)
    ci = data.frames[CARBON_INTENSITY]
    assert list(ci.columns) == list(COLUMNS[CARBON_INTENSITY])
    assert len(ci) == 6 and set(ci["region"]) == {"DE"} and set(ci["data_source"]) == {"entsoe"}
    assert set(zip(ci["signal_type"], ci["basis"], ci["scope"])) == {("average", "production", "direct")}
    mix = data.frames[GENERATION].pivot(index="hour_utc", columns="fuel", values="generation_mw").fillna(0.0)
    expected = intensity_from_mix(mix, CARBONCAST_DIRECT)
    assert ci.set_index("hour_utc")["carbon_intensity_gco2_per_kwh"].to_numpy() == pytest.approx(expected.to_numpy())
    assert ci.loc[ci["hour_utc"] == _hour(3), "quality_flag"].item() == "recomputed_from_mix;partial_hour"
    assert set(ci.loc[ci["hour_utc"] != _hour(3), "quality_flag"]) == {"recomputed_from_mix"}


def test_a_type_missing_in_an_hour_flags_the_mix(api, feeds):
    quarters = 6 * 4
    series = [
        Series("B04", S, [5000.0] * quarters),
        Series("B14", S, [8000.0] * quarters),
        Series("B16", S, [1000.0] * (quarters - 4)),  # solar not yet reported for 05:00
    ]
    api.route(ENTSOE_PATH, lambda request: (200, _de(series), XML))
    ci = feeds.connector("entsoe").fetch("DE", "DE", S, E).frames[CARBON_INTENSITY].set_index("hour_utc")
    assert ci.loc[_hour(5), "quality_flag"] == "recomputed_from_mix;partial_mix"
    assert ci.loc[_hour(5), "carbon_intensity_gco2_per_kwh"] == pytest.approx(5000 * 370 / 13000)
    assert ci.loc[_hour(0), "carbon_intensity_gco2_per_kwh"] == pytest.approx(5000 * 370 / 14000)


def test_an_hourly_fetch_still_sees_missing_types_and_quarters(api, feeds):
    begin = S - pd.Timedelta(hours=24)
    quarters = 30 * 4  # from 24 h before the interval to 06:00
    series = [
        Series("B04", begin, [5000.0] * quarters),
        Series("B14", begin, [8000.0] * (quarters - 3)),  # 05:15-05:45 not published yet
        Series("B16", begin, [1000.0] * (quarters - 4)),  # no solar yet for 05:00
    ]
    document = gl_market_document(DE_EIC, begin, E, series)
    api.route(ENTSOE_PATH, lambda request: (200, document, XML))
    data = feeds.connector("entsoe").fetch("DE", "DE", _hour(5), E)
    [call] = api.calls(ENTSOE_PATH)
    assert (call.param("periodStart"), call.param("periodEnd")) == ("202106300500", "202107010600")
    ci = data.frames[CARBON_INTENSITY]
    assert ci["hour_utc"].tolist() == [_hour(5)]
    assert ci["quality_flag"].item() == "recomputed_from_mix;partial_hour;partial_mix"
    assert ci["carbon_intensity_gco2_per_kwh"].item() == pytest.approx(5000 * 370 / 13000)
    gen = data.frames[GENERATION].set_index("fuel")
    assert gen.loc["nuclear", "quality_flag"] == "partial_hour" and pd.isna(gen.loc["nat_gas", "quality_flag"])


def test_every_psr_generation_type_has_a_contract_fuel():
    assert sorted(PSR_FUELS) == [f"B{i:02d}" for i in range(1, 21) if i != 10]
    assert set(PSR_FUELS.values()) <= set(CARBONCAST_DIRECT)


def test_long_intervals_are_split_and_cached(api, feeds, client):
    connector = feeds.connector("entsoe")
    connector.fetch("DE", "DE", S, S + pd.Timedelta(days=9))
    assert [(c.param("periodStart"), c.param("periodEnd")) for c in api.calls(ENTSOE_PATH)] == [
        ("202106300000", "202107070000"),
        ("202107070000", "202107100000"),
    ]
    data = connector.fetch("DE", "DE", S, S + pd.Timedelta(days=9))
    assert api.count(ENTSOE_PATH) == 2  # both documents came from the cache
    assert len(data.frames[CARBON_INTENSITY]) == 9 * 24
    cached = "".join(p.read_text() for p in client.cache.directory.rglob("*.json"))
    assert "GL_MarketDocument" in cached and ENTSOE_KEY not in cached


# -- bad responses -------------------------------------------------------------------------------------------------
def test_no_matching_data_is_empty_and_the_fallback_serves(api, feeds):
    api.route(ENTSOE_PATH, lambda request: (200, no_matching_data(DE_EIC, S, E), XML))
    data = feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert data.rows(CARBON_INTENSITY) == 0 and data.rows(GENERATION) == 0
    fetched = feeds.fetch_region("DE", START, END)
    assert fetched.served_by == "electricitymaps" and "no carbon-intensity rows for DE" in fetched.errors["entsoe"]
    assert all(
        "fallback_from=entsoe" in flag.split(";") for flag in fetched.data.frames[CARBON_INTENSITY]["quality_flag"]
    )


def test_no_matching_data_with_another_content_type_is_empty_too(api, feeds):
    api.route(ENTSOE_PATH, lambda request: (200, no_matching_data(DE_EIC, S, E), {"Content-Type": "text/xml; q=1"}))
    assert feeds.connector("entsoe").fetch("DE", "DE", S, E).rows(CARBON_INTENSITY) == 0


def test_500_is_retried_then_fails_over(api, feeds, sleeps):
    api.route(ENTSOE_PATH, lambda request: (500, "<html>Internal Server Error</html>"))
    with pytest.raises(HttpStatusError, match=r"entsoe: GET .*/api.* failed after 3 attempts: HTTP 500") as info:
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert info.value.status == 500 and ENTSOE_KEY not in str(info.value)
    assert api.count(ENTSOE_PATH) == 3 and len(sleeps) == 2
    fetched = feeds.fetch_region("DE", START, END)
    assert fetched.served_by == "electricitymaps" and "HTTP 500" in fetched.errors["entsoe"]


def test_429_waits_for_retry_after(api, feeds, sleeps):
    api.route(ENTSOE_PATH, sequence((429, "Too many requests", {"Retry-After": "7"}), lambda r: (200, _de(), XML)))
    data = feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert data.rows(CARBON_INTENSITY) == 6 and sleeps == [7.0]


def test_429_too_long_fails_at_once_and_fails_over(api, feeds, sleeps):
    api.route(ENTSOE_PATH, lambda request: (429, "Too many requests", {"Retry-After": "3600"}))
    with pytest.raises(RateLimitedError, match="asks to wait 3600 s"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert api.count(ENTSOE_PATH) == 1 and sleeps == []
    assert feeds.fetch_region("DE", START, END).served_by == "electricitymaps"


def test_429_forever_is_rate_limited(api, feeds, sleeps):
    api.route(ENTSOE_PATH, lambda request: (429, "Too many requests"))
    with pytest.raises(RateLimitedError, match="still rate limited"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert api.count(ENTSOE_PATH) == 3


def test_bad_token_names_the_token(api, feeds, monkeypatch):
    monkeypatch.setenv("ENTSOE_API_KEY", "wrong-token-123")
    with pytest.raises(HttpStatusError, match="HTTP 401 \\(check the security token\\)") as info:
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert "wrong-token-123" not in str(info.value) and api.count(ENTSOE_PATH) == 1


def test_refused_request_gives_the_acknowledgement_reason(api, feeds):
    refusal = acknowledgement("The combination of [in_Domain=10Y1001A1001A83F] is not valid", code="999")
    api.route(ENTSOE_PATH, lambda request: (400, refusal, XML))
    with pytest.raises(HttpStatusError, match="HTTP 400: .*is not valid") as info:
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert info.value.status == 400


def test_missing_token_names_the_env_var(api, config, client):
    from warehouse.connectors.feeds import LiveFeeds

    with pytest.raises(MissingCredentialError, match="ENTSOE_API_KEY.*'entsoe_default'"):
        LiveFeeds(config, client).connector("entsoe").fetch("DE", "DE", S, E)


def test_malformed_xml_is_a_payload_error(api, feeds):
    api.route(ENTSOE_PATH, lambda request: (200, _de()[:-200], XML))
    with pytest.raises(PayloadError, match="XML that does not parse"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)
    fetched = feeds.fetch_region("DE", START, END)
    assert fetched.served_by == "electricitymaps" and "does not parse" in fetched.errors["entsoe"]


def test_wrong_unit_is_a_payload_error_naming_the_series(api, feeds):
    series = de_sample(S, E)
    series[6].unit = "KWH"  # nuclear
    api.route(ENTSOE_PATH, lambda request: (200, _de(series), XML))
    with pytest.raises(PayloadError, match=r"TimeSeries 7 \(psrType B14\) has quantity_Measure_Unit.name 'KWH'"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)


def test_another_document_is_a_payload_error(api, feeds):
    other = _de().replace("<type>A75</type>", "<type>A44</type>")
    api.route(ENTSOE_PATH, lambda request: (200, other, XML))
    with pytest.raises(PayloadError, match="document type 'A44' is not A75"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)


def test_non_numeric_quantity_is_a_payload_error(api, feeds):
    api.route(
        ENTSOE_PATH,
        lambda request: (200, _de().replace("<quantity>8100</quantity>", "<quantity>n/a</quantity>", 1), XML),
    )
    with pytest.raises(PayloadError, match="could not be parsed"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)


def test_connection_refused_is_a_transport_error(config, client, keys):
    from warehouse.connectors.feeds import LiveFeeds

    feeds = LiveFeeds(config.with_base_urls({"entsoe": "http://127.0.0.1:9"}), client)
    with pytest.raises(TransportError, match="connection failed"):
        feeds.connector("entsoe").fetch("DE", "DE", S, E)


def test_unknown_zone_code_is_named(api, feeds):
    with pytest.raises(ValueError, match="'XX-NOWHERE' is not an ENTSO-E area"):
        feeds.connector("entsoe").fetch("DE", "XX-NOWHERE", S, E)


def test_token_never_reaches_the_logs(api, feeds, caplog):
    caplog.set_level(logging.DEBUG)
    api.route(ENTSOE_PATH, sequence((500, "busy"), lambda r: (200, _de(), XML)))
    feeds.connector("entsoe").fetch("DE", "DE", S, E)
    assert any("securityToken" in r.getMessage() for r in caplog.records)  # entsoe-py's request line
    assert all(ENTSOE_KEY not in r.getMessage() for r in caplog.records)
