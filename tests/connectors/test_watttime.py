"""WattTime through the `watttime` SDK against the local server: bad responses, retries, cache and failover."""

from __future__ import annotations

import dataclasses
import os
import re

import pandas as pd
import pytest

from tests.connectors.conftest import END, START, WT_PASSWORD, WT_USER, payload, sequence, slow
from warehouse.connectors.feeds import FeedUnavailable, LiveFeeds, RegionFeeds
from warehouse.connectors.http import (
    HttpClient,
    HttpStatusError,
    PayloadError,
    RateLimitedError,
    TransportError,
)
from warehouse.connectors.schema import CARBON_INTENSITY

S, E = pd.Timestamp(START), pd.Timestamp(END)
HISTORICAL = "watttime_historical_CAISO_NORTH.json"


def _body(**meta) -> dict:
    body = payload(HISTORICAL)
    body["meta"].update(meta)
    return body


def _bad(case: str):
    """The /v3/historical handler of one bad-response case, and the error it must produce."""
    return {
        "rate limited too long": (
            lambda r: (429, {"error": "slow down"}, {"Retry-After": "3600"}),
            RateLimitedError,
            "429.*3600 s",
        ),
        "500 forever": (lambda r: (500, "internal error"), HttpStatusError, "failed after 3 attempts: HTTP 500"),
        "empty body": (lambda r: (200, b""), PayloadError, "not JSON"),
        "not JSON": (lambda r: (200, "<html>maintenance</html>"), PayloadError, "not JSON"),
        "no meta": (lambda r: (200, {"data": []}), PayloadError, "KeyError: 'meta'"),
        "data not a list": (lambda r: (200, {**_body(), "data": {"x": 1}}), PayloadError, "'data' is not a list"),
        "wrong units": (lambda r: (200, _body(units="percent")), PayloadError, "meta.units 'percent'"),
        "not a signal": (lambda r: (200, _body(signal_type="health_damage")), PayloadError, "'health_damage'"),
    }[case]


CASES = [
    "rate limited too long",
    "500 forever",
    "empty body",
    "not JSON",
    "no meta",
    "data not a list",
    "wrong units",
    "not a signal",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_responses_fail_clearly(api, feeds, sleeps, case):
    handler, error, message = _bad(case)
    api.route("/v3/historical", handler)
    with pytest.raises(error, match=message):
        feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    expected_calls = 3 if case == "500 forever" else 1  # the SDK's own urllib3 retries are off: one policy
    assert api.count("/v3/historical") == expected_calls
    assert len(sleeps) == expected_calls - 1


def test_429_waits_for_retry_after_then_succeeds(api, feeds, sleeps):
    api.route(
        "/v3/historical", sequence((429, {"error": "slow down"}, {"Retry-After": "7"}), (200, payload(HISTORICAL)))
    )
    data = feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    assert len(data.frames[CARBON_INTENSITY]) == 6
    assert sleeps == [7.0] and api.count("/v3/historical") == 2


def test_5xx_backs_off_then_succeeds(api, feeds, sleeps):
    api.route("/v3/historical", sequence((502, "bad gateway"), (200, payload(HISTORICAL))))
    data = feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    assert len(data.frames[CARBON_INTENSITY]) == 6 and len(sleeps) == 1


def test_empty_data_gives_no_rows(api, feeds):
    api.route("/v3/historical", lambda r: (200, {**payload(HISTORICAL), "data": []}))
    assert len(feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E).frames[CARBON_INTENSITY]) == 0


def test_bad_login_names_the_credentials(api, config, client, sleeps):
    feeds = LiveFeeds(config, client, credentials={"watttime": {"username": WT_USER, "password": "wrong"}})
    with pytest.raises(HttpStatusError, match=r"/login failed with HTTP 403 \(check the credentials\)"):
        feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    assert api.count("/v3/historical") == 0


def test_password_stays_out_of_the_environment(api, config, client):
    feeds = LiveFeeds(config, client, credentials={"watttime": {"username": WT_USER, "password": WT_PASSWORD}})
    assert len(feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E).frames[CARBON_INTENSITY]) == 6
    assert WT_PASSWORD not in os.environ.values() and "WATTTIME_USER" not in os.environ


def test_read_timeout_comes_from_the_feed_settings(api, config, keys, sleeps):
    client = HttpClient(dataclasses.replace(config.http, read_timeout_s=0.2, max_attempts=2), sleep=sleeps.append)
    api.route("/v3/historical", slow(1.0, (200, payload(HISTORICAL))))
    with pytest.raises(TransportError, match="timed out"):
        LiveFeeds(config, client).connector("watttime").fetch("CISO", "CAISO_NORTH", S, E)
    assert api.count("/v3/historical") == 2


def test_responses_are_cached(api, feeds):
    first = feeds.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E).frames[CARBON_INTENSITY]
    again = LiveFeeds(feeds.config, feeds.client, credentials={"watttime": {"username": WT_USER, "password": "x"}})
    second = again.connector("watttime").fetch("CISO", "CAISO_NORTH", S, E).frames[CARBON_INTENSITY]
    pd.testing.assert_frame_equal(first, second)
    assert api.count("/v3/historical") == 1 and api.count("/login") == 1  # the cache hit needs no login


# -- failover --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_failing_extra_is_reported_and_the_region_still_served(api, feeds, case):
    handler, _, message = _bad(case)
    api.route("/v3/historical", handler)
    failures = []
    batches = feeds.batches(["CISO"], START, END, failures=failures, forecasts=False)
    assert any(b.batch_id.startswith("eia930:CISO") and len(b.frame) for b in batches)
    assert [(f.kind, f.feed, f.region) for f in failures] == [("extra", "watttime", "CISO")]
    assert re.search(message, failures[0].message)


def _watttime_primary(feeds: LiveFeeds) -> LiveFeeds:
    """DE served by WattTime's average signal (co2_aoer), Electricity Maps as the fallback."""
    region = RegionFeeds(
        "DE", "watttime", "electricitymaps", codes={"watttime": "CAISO_NORTH", "electricitymaps": "DE"}
    )
    feeds.config = dataclasses.replace(feeds.config, regions={**feeds.config.regions, "DE": region})
    feeds.config = feeds.config.with_options("watttime", signal_type="co2_aoer")
    return feeds


def _aoer(request):
    assert request.param("signal_type") == "co2_aoer"
    return 200, _body(signal_type="co2_aoer")


def test_watttime_primary_serves_its_average_signal(api, feeds):
    api.route("/v3/historical", _aoer)
    fetched = _watttime_primary(feeds).fetch_region("DE", START, END)
    ci = fetched.data.frames[CARBON_INTENSITY]
    assert fetched.served_by == "watttime" and set(ci["signal_type"]) == {"average"}


@pytest.mark.parametrize(
    "handler, message",
    [
        (lambda r: (500, "internal error"), "HTTP 500"),
        (lambda r: (429, "", {"Retry-After": "3600"}), "rate limited"),
        (lambda r: (200, {**_body(signal_type="co2_aoer"), "data": []}), "no carbon-intensity rows"),
        (lambda r: (200, _body(signal_type="co2_aoer", units="MW")), "meta.units 'MW'"),
    ],
)
def test_failing_primary_hands_over_to_the_fallback(api, feeds, handler, message):
    api.route("/v3/historical", handler)
    fetched = _watttime_primary(feeds).fetch_region("DE", START, END)
    assert fetched.served_by == "electricitymaps" and fetched.fallback_used
    assert message in fetched.errors["watttime"]


def test_both_failing_names_both(api, feeds):
    api.route("/v3/historical", lambda r: (200, b""))
    api.route("/v3/carbon-intensity/past-range", lambda r: (503, "maintenance"))
    with pytest.raises(FeedUnavailable, match="watttime: .*not JSON.*; electricitymaps: .*HTTP 503"):
        _watttime_primary(feeds).fetch_region("DE", START, END)
