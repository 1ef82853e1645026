"""The shared client over a real socket: retries, 429, timeouts, cache, credentials and redaction."""

from __future__ import annotations

import email.utils
import logging
import sys
import time
import traceback

import pytest

from tests.connectors.conftest import EIA_KEY, EIA_PATH, END, START, sequence, slow
from warehouse.connectors.http import (
    HttpClient,
    HttpSettings,
    HttpStatusError,
    MissingCredentialError,
    RateLimitedError,
    TransportError,
    cache_key,
    get_credentials,
    redact,
)

OK = (200, {"ok": True})


def test_429_waits_for_retry_after_then_succeeds(api, client, sleeps):
    api.route("/thing", sequence((429, {"error": "slow down"}, {"Retry-After": "7"}), OK))
    assert client.get_json(api.url + "/thing") == {"ok": True}
    assert api.count("/thing") == 2 and sleeps == [7.0]


def test_429_retry_after_as_http_date(api, config, sleeps):
    now = 1_700_000_000.0
    client = HttpClient(config.http, sleep=sleeps.append, clock=lambda: now)
    when = email.utils.formatdate(now + 12, usegmt=True)
    api.route("/thing", sequence((429, "", {"Retry-After": when}), OK))
    assert client.get_json(api.url + "/thing", use_cache=False) == {"ok": True}
    assert sleeps == [pytest.approx(12.0)]


def test_429_asking_too_long_fails_at_once(api, client, sleeps):
    api.route("/thing", sequence((429, "", {"Retry-After": "3600"}), OK))
    with pytest.raises(RateLimitedError, match="3600 s"):
        client.get_json(api.url + "/thing")
    assert api.count("/thing") == 1 and sleeps == []


def test_5xx_backs_off_exponentially_then_succeeds(api, client, sleeps):
    api.route("/thing", sequence((500, "boom"), (503, "busy"), OK))
    assert client.get_json(api.url + "/thing") == {"ok": True}
    assert api.count("/thing") == 3
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 0.55 and 1.0 <= sleeps[1] <= 1.1  # base 0.5 s, doubling


def test_5xx_forever_gives_up_after_max_attempts(api, client, sleeps):
    api.route("/thing", lambda request: (502, "bad gateway"))
    with pytest.raises(HttpStatusError, match="failed after 3 attempts: HTTP 502") as info:
        client.get_json(api.url + "/thing")
    assert info.value.status == 502 and api.count("/thing") == 3 and len(sleeps) == 2


def test_4xx_is_not_retried(api, client, sleeps):
    api.route("/thing", lambda request: (400, {"error": "bad zone"}))
    with pytest.raises(HttpStatusError, match="HTTP 400") as info:
        client.get_json(api.url + "/thing")
    assert info.value.status == 400 and api.count("/thing") == 1 and sleeps == []


def test_read_timeout_is_retried_then_reported(api, config, sleeps):
    settings = HttpSettings(**{**config.http.__dict__, "read_timeout_s": 0.2, "max_attempts": 2})
    client = HttpClient(settings, sleep=sleeps.append)
    api.route("/slow", slow(1.0, OK))
    started = time.monotonic()
    with pytest.raises(TransportError, match="timed out"):
        client.get_json(api.url + "/slow")
    assert time.monotonic() - started < 1.5
    assert api.count("/slow") == 2 and len(sleeps) == 1


def test_timeout_then_success(api, config, sleeps):
    settings = HttpSettings(**{**config.http.__dict__, "read_timeout_s": 0.2})
    client = HttpClient(settings, sleep=sleeps.append)
    api.route("/slow", sequence(slow(0.6, OK), OK))
    assert client.get_json(api.url + "/slow") == {"ok": True}


def test_connection_refused_is_retried_then_reported(config, sleeps):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = HttpClient(config.http, sleep=sleeps.append)
    with pytest.raises(TransportError, match="connection failed"):
        client.get_json(f"http://127.0.0.1:{port}/nothing")
    assert len(sleeps) == 2


def test_cache_hit_skips_the_server_and_expires(api, config, sleeps, tmp_path):
    now = [1_000_000.0]
    client = HttpClient(config.http, cache_dir=tmp_path / "c", sleep=sleeps.append, clock=lambda: now[0])
    api.route("/thing", lambda request: OK)
    url = api.url + "/thing"
    assert client.get_json(url, params={"zone": "DE"}) == {"ok": True}
    assert client.get_json(url, params={"zone": "DE"}) == {"ok": True}
    assert api.count("/thing") == 1  # second answer from disk
    client.get_json(url, params={"zone": "FR"})
    assert api.count("/thing") == 2  # other params, other entry
    now[0] += config.http.cache_ttl_s + 1
    client.get_json(url, params={"zone": "DE"})
    assert api.count("/thing") == 3  # expired
    client.get_json(url, params={"zone": "DE"}, use_cache=False)
    assert api.count("/thing") == 4


def test_cache_is_shared_by_connectors_and_keyed_without_secrets(api, feeds):
    from common.timeutil import utc as to_utc

    connector = feeds.connector("eia930")
    connector.fetch("CISO", "CISO", to_utc(START), to_utc(END))
    connector.fetch("CISO", "CISO", to_utc(START), to_utc(END))
    assert api.count(EIA_PATH) == 2  # two pages, once
    assert cache_key("GET", "http://h/p", {"api_key": "a", "x": 1}) == cache_key(
        "GET", "http://h/p", [("x", "1"), ("api_key", "b")]
    )


def test_secret_never_in_logs_errors_or_cache(api, feeds, caplog, tmp_path):
    from common.timeutil import utc as to_utc

    caplog.set_level(logging.DEBUG)
    feeds.connector("eia930").fetch("CISO", "CISO", to_utc(START), to_utc(END))
    api.route(EIA_PATH, lambda request: (500, "internal error"))
    with pytest.raises(HttpStatusError) as info:
        feeds.connector("eia930").fetch("CISO", "CISO", to_utc("2021-08-01"), to_utc("2021-08-02"))
    message = str(info.value)
    assert EIA_KEY not in message and "api_key=***" in message
    assert EIA_KEY not in "".join(traceback.format_exception(info.value))  # nothing chained leaks it either
    assert caplog.records and "urllib3" in {r.name.split(".")[0] for r in caplog.records}  # its URL lines were seen
    assert EIA_KEY not in caplog.text
    cache_files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert cache_files
    for path in cache_files:
        assert EIA_KEY not in str(path) and EIA_KEY not in path.read_text()


def test_redact_masks_registered_values_and_secret_params():
    from warehouse.connectors.http import register_secret

    register_secret("s3cr3t-value-xyz")
    text = "GET http://h/p?api_key=abc123&token=t0k&zone=DE failed; header s3cr3t-value-xyz"
    assert redact(text) == "GET http://h/p?api_key=***&token=***&zone=DE failed; header ***"


# -- credentials -----------------------------------------------------------------------------------------------
def test_missing_key_names_env_var_and_connection():
    with pytest.raises(MissingCredentialError) as info:
        get_credentials("electricitymaps")
    assert "ELECTRICITYMAPS_API_KEY" in str(info.value) and "'electricitymaps_default'" in str(info.value)
    with pytest.raises(MissingCredentialError, match="WATTTIME_USERNAME and WATTTIME_PASSWORD.*'watttime_default'"):
        get_credentials("watttime")
    with pytest.raises(MissingCredentialError, match="EIA_API_KEY.*'eia_default'"):
        get_credentials("eia930")


def test_missing_key_surfaces_from_a_fetch(api, config, client):
    from common.timeutil import utc as to_utc
    from warehouse.connectors.feeds import LiveFeeds

    with pytest.raises(MissingCredentialError, match="EIA_API_KEY"):
        LiveFeeds(config, client).connector("eia930").fetch("CISO", "CISO", to_utc(START), to_utc(END))
    assert api.count(EIA_PATH) == 0


def test_airflow_connection_from_env_without_importing_airflow(monkeypatch):
    airflow_loaded = "airflow" in sys.modules
    monkeypatch.setenv("CONNECTORS_USE_AIRFLOW", "auto")
    monkeypatch.setenv("AIRFLOW_CONN_EIA_DEFAULT", '{"conn_type": "http", "password": "from-airflow-json"}')
    monkeypatch.setenv("AIRFLOW_CONN_WATTTIME_DEFAULT", "http://wt%20user:p%40ss@api.watttime.org")
    assert get_credentials("eia930") == {"api_key": "from-airflow-json"}
    assert get_credentials("watttime") == {"username": "wt user", "password": "p@ss"}
    monkeypatch.setenv("EIA_API_KEY", "from-env")  # the environment wins
    assert get_credentials("eia930") == {"api_key": "from-env"}
    assert ("airflow" in sys.modules) == airflow_loaded  # AIRFLOW_CONN_* is parsed without importing Airflow
