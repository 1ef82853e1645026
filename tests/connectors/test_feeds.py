"""Feed configuration, primary/fallback, batches and idempotent loading into a tmp warehouse."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.connectors.conftest import EIA_PATH, END, START
from warehouse.connectors.feeds import FeedUnavailable, LiveFeeds, load_feed_config, parse_feed_config
from warehouse.connectors.ingest import LiveIngestError, ingest_live
from warehouse.connectors.schema import CARBON_INTENSITY, GENERATION, GENERATION_SHARE, LIVE_FORECASTS
from warehouse.db import reader

INTERVAL = "2021-07-01T00:00:00Z/2021-07-01T06:00:00Z"


def _ukci_down(api):
    api.route("/intensity/", lambda request: (500, "internal error"), prefix=True)
    api.route("/generation/", lambda request: (500, "internal error"), prefix=True)


# -- configuration ---------------------------------------------------------------------------------------------
def test_default_config_is_valid_and_complete():
    config = load_feed_config()
    assert set(config.feeds) == {"electricitymaps", "watttime", "ukci", "eia930", "entsoe"}
    assert (config.region("GB").primary, config.region("GB").fallback) == ("ukci", "electricitymaps")
    assert (config.region("CISO").primary, config.region("CISO").fallback) == ("eia930", "electricitymaps")
    for region in ("DE", "ES", "NL", "PL", "SE"):
        assert (config.region(region).primary, config.region(region).fallback) == ("entsoe", "electricitymaps")
    assert config.region("CISO").code("electricitymaps") == "US-CAL-CISO"
    with pytest.raises(KeyError, match="no live feed configured"):
        config.region("ATLANTIS")


def test_base_url_from_environment(monkeypatch):
    monkeypatch.setenv("UKCI_BASE_URL", "http://127.0.0.1:9")
    assert load_feed_config().feeds["ukci"].base_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"feeds": {"nope": {"base_url": "x"}}}, "no connector"),
        ({"feeds": {"ukci": {}}}, "no base_url"),
        ({"feeds": {"ukci": {"base_url": "x"}}, "regions": {"GB": {"primary": "electricitymaps"}}}, "not configured"),
        ({"feeds": {"ukci": {"base_url": "x"}}, "regions": {"GB": {"fallback": "ukci"}}}, "no primary"),
        ({"http": {"retries": 3}}, "unknown http settings"),
        (
            {
                "feeds": {"ukci": {"base_url": "x"}, "electricitymaps": {"base_url": "y"}},
                "regions": {"GB": {"primary": "ukci", "fallback": "electricitymaps", "extras": ["ukci"]}},
            },
            "already its primary",
        ),
    ],
)
def test_bad_config_is_rejected_clearly(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_feed_config(raw, env={})


# -- primary / fallback ----------------------------------------------------------------------------------------
def test_primary_serves_when_healthy(api, feeds):
    fetched = feeds.fetch_region("GB", START, END)
    assert fetched.served_by == "ukci" and not fetched.fallback_used and fetched.errors == {}
    assert set(fetched.data.frames) == {CARBON_INTENSITY, GENERATION_SHARE}
    assert api.count("/v3/") == 0  # the fallback was not asked


def test_fallback_when_primary_returns_500_forever(api, feeds, sleeps):
    _ukci_down(api)
    fetched = feeds.fetch_region("GB", START, END)
    assert fetched.served_by == "electricitymaps" and fetched.fallback_used
    assert "HTTP 500" in fetched.errors["ukci"]
    assert api.count("/intensity/") == 3  # the client's retries, then the fallback
    ci = fetched.data.frames[CARBON_INTENSITY]
    assert len(ci) == 6 and set(ci["data_source"]) == {"electricitymaps"}
    assert set(ci["quality_flag"]) == {"fallback_from=ukci"}
    assert set(ci["region"]) == {"GB"} and set(ci["basis"]) == {"consumption"}
    gen = fetched.data.frames[GENERATION]
    assert set(gen["quality_flag"]) == {"fallback_from=ukci"}
    assert api.calls("/v3/carbon-intensity/past-range")[0].param("zone") == "GB"


def test_fallback_when_primary_has_no_rows(api, feeds):
    def empty(request):
        from tests.connectors.conftest import payload

        body = payload("eia930_fuel_type_data_CISO_page1.json")
        body["response"]["data"], body["response"]["total"] = [], "0"
        return 200, body

    api.route(EIA_PATH, empty)
    with pytest.raises(FeedUnavailable) as info:  # US-CAL-CISO has no recorded EM payload: 404
        feeds.fetch_region("CISO", START, END)
    assert "no carbon-intensity rows" in info.value.errors["eia930"]
    assert "HTTP 404" in info.value.errors["electricitymaps"]


def test_both_feeds_failing_names_both(api, feeds):
    _ukci_down(api)
    api.route("/v3/carbon-intensity/past-range", lambda request: (503, "maintenance"))
    with pytest.raises(FeedUnavailable, match="region GB: ukci: .*HTTP 500.*; electricitymaps: .*HTTP 503"):
        feeds.fetch_region("GB", START, END)


def test_missing_fallback_key_is_reported_with_the_primary_error(api, config, client):
    _ukci_down(api)
    with pytest.raises(FeedUnavailable, match="ELECTRICITYMAPS_API_KEY"):
        LiveFeeds(config, client).fetch_region("GB", START, END)


# -- batches ---------------------------------------------------------------------------------------------------
def test_batches_are_keyed_by_feed_region_and_interval(api, feeds):
    batches = feeds.batches(["GB", "CISO"], START, END)
    keys = {(b.table, b.batch_id) for b in batches}
    assert (CARBON_INTENSITY, f"ukci:GB:{INTERVAL}") in keys
    assert (GENERATION_SHARE, f"ukci:GB:{INTERVAL}") in keys
    assert (CARBON_INTENSITY, f"eia930:CISO:{INTERVAL}") in keys and (GENERATION, f"eia930:CISO:{INTERVAL}") in keys
    assert (CARBON_INTENSITY, f"watttime:CISO:{INTERVAL}") in keys  # the extra feed
    assert (LIVE_FORECASTS, "watttime:CISO:forecast@2021-07-01T06:00:00Z") in keys
    # primary served: the fallback's batches of the interval are emptied (supersede)
    superseded = [b for b in batches if b.batch_id.startswith("electricitymaps:")]
    assert {b.batch_id for b in superseded} == {f"electricitymaps:GB:{INTERVAL}", f"electricitymaps:CISO:{INTERVAL}"}
    assert all(len(b.frame) == 0 for b in superseded)
    quarantined = [b for b in batches if b.rejections]
    assert [(b.table, len(b.rejections)) for b in quarantined] == [(GENERATION, 1)]  # EIA's null value
    for b in batches:
        assert b.source == b.batch_id.split(":")[0]


def test_extra_feed_failure_does_not_block_the_region(api, feeds):
    api.route("/v3/historical", lambda request: (500, "down"))
    failures = []
    batches = feeds.batches(["CISO"], START, END, failures=failures, forecasts=False)
    assert any(b.batch_id.startswith("eia930:CISO") and len(b.frame) for b in batches)
    assert [(f.kind, f.feed, f.region) for f in failures] == [("extra", "watttime", "CISO")]


def _counts(path) -> dict:
    with reader(path) as con:
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_schema || '.' || table_name FROM information_schema.tables "
                "WHERE table_schema IN ('raw', 'quarantine') ORDER BY 1"
            ).fetchall()
        ]
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}


def test_idempotent_reload_into_a_tmp_warehouse(api, config, client, keys, tmp_warehouse):
    first = ingest_live(["GB", "CISO", "DE"], START, END, config=config, client=client)
    counts = _counts(tmp_warehouse)
    assert counts["raw.grid_carbon_intensity"] == 6 + 12 + 6 + 6  # ukci, eia930 (direct+lifecycle), watttime, entsoe DE
    assert counts["raw.grid_generation"] == 47 + 42  # eia930 CISO, entsoe DE (7 fuels x 6 h)
    assert counts["raw.grid_generation_share"] == 54 and counts["raw.grid_live_forecasts"] == 3
    assert counts["quarantine.rejected_rows"] == 1
    second = ingest_live(["GB", "CISO", "DE"], START, END, config=config, client=client)
    assert _counts(tmp_warehouse) == counts
    assert all(r.skipped_unchanged for r in second.results) and len(second.results) == len(first.results)
    # DE's WattTime extra is not in the (recorded) plan: reported, not fatal
    assert [(f.kind, f.feed, f.region) for f in first.failures] == [("extra", "watttime", "DE")]
    assert "HTTP 403" in first.failures[0].message
    with reader(tmp_warehouse) as con:
        dupes = con.execute(
            """SELECT count(*) FROM (SELECT region, hour_utc, signal_type, basis, scope, data_source, count(*) n
               FROM raw.grid_carbon_intensity GROUP BY ALL HAVING n > 1)"""
        ).fetchone()[0]
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'grid_carbon_intensity'"
            ).fetchall()
        )
        sources = dict(con.execute("SELECT data_source, count(*) FROM raw.grid_carbon_intensity GROUP BY 1").fetchall())
    assert dupes == 0
    assert types["hour_utc"] == "TIMESTAMP WITH TIME ZONE" and types["carbon_intensity_gco2_per_kwh"] == "DOUBLE"
    assert sources == {"ukci": 6, "eia930": 12, "watttime": 6, "entsoe": 6}


def test_primary_recovering_replaces_the_fallback_rows(api, config, client, keys, tmp_warehouse):
    from tests.connectors.conftest import install_services

    _ukci_down(api)
    ingest_live(["GB"], START, END, config=config, client=client)
    with reader(tmp_warehouse) as con:
        before = con.execute(
            "SELECT data_source, quality_flag, count(*) FROM raw.grid_carbon_intensity GROUP BY ALL"
        ).fetchall()
    assert before == [("electricitymaps", "fallback_from=ukci", 6)]
    install_services(api)  # ukci is back
    ingest_live(["GB"], START, END, config=config, client=client)
    with reader(tmp_warehouse) as con:
        after = con.execute("SELECT data_source, count(*) FROM raw.grid_carbon_intensity GROUP BY ALL").fetchall()
        gen = con.execute("SELECT count(*) FROM raw.grid_generation").fetchone()[0]
    assert after == [("ukci", 6)] and gen == 0


def test_unserved_region_does_not_block_the_others(api, config, client, keys, tmp_warehouse):
    _ukci_down(api)
    api.route("/v3/carbon-intensity/past-range", lambda request: (500, "down"))
    with pytest.raises(LiveIngestError, match="GB") as info:
        ingest_live(["GB", "CISO"], START, END, config=config, client=client, extras=False, forecasts=False)
    assert {r.batch_id.split(":")[1] for r in info.value.results} == {"CISO"}
    assert _counts(tmp_warehouse)["raw.grid_carbon_intensity"] == 12


def test_interval_is_explicit_and_hour_aligned(api, feeds):
    fetched = feeds.fetch_region("GB", pd.Timestamp("2021-07-01T00:20"), "2021-07-01T05:10Z")
    assert (fetched.start, fetched.end) == (pd.Timestamp(START), pd.Timestamp(END))
    with pytest.raises(ValueError, match="empty interval"):
        feeds.fetch_region("GB", END, START)


def test_cli_fetch_json(api, config, keys, tmp_path, monkeypatch, capsys):
    from warehouse.connectors.__main__ import main

    for feed in ("ELECTRICITYMAPS", "WATTTIME", "UKCI", "EIA930", "ENTSOE"):
        monkeypatch.setenv(f"{feed}_BASE_URL", api.url)
    code = main(["fetch", "--region", "GB", "--start", START, "--end", END, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["regions"][0]["served_by"] == "ukci"
    assert out["regions"][0]["tables"] == {CARBON_INTENSITY: 6, GENERATION_SHARE: 54}
