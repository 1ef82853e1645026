"""A real HTTP server on 127.0.0.1 that plays the five grid APIs from the recorded payloads.

Nothing in the HTTP client is mocked: the connectors talk to this server over a socket. Handlers check the
credentials the way the services do (auth-token header, basic auth + bearer token, api_key parameter), record
every request, and can be replaced per test (500 forever, 429 then 200, slow responses, ...). ENTSO-E answers
with XML documents written by tests/connectors/entsoe_documents.py.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pandas as pd
import pytest

from tests.connectors.entsoe_documents import DE_EIC, acknowledgement, de_sample, gl_market_document, no_matching_data

PAYLOADS = Path(__file__).parent / "payloads"
EM_KEY = "em-test-key-7f3a9c"
WT_USER, WT_PASSWORD = "planner", "wt-pass-51ce0d"
WT_TOKEN = "wt-bearer-token-e4b21a77"
EIA_KEY = "EIA-SECRET-KEY-0123456789"
ENTSOE_KEY = "entsoe-token-8d1c5f0e-7a2b"
ENTSOE_PATH = "/api"
START, END = "2021-07-01T00:00Z", "2021-07-01T06:00Z"


def payload(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


Response = tuple  # (status, body, headers) ; body: JSON-able, bytes or str
Handler = Callable[[Request], Response]


class FakeApi:
    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.prefix_routes: dict[str, Handler] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        api = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                parts = urlsplit(self.path)
                request = Request("GET", parts.path, parse_qs(parts.query, keep_blank_values=True), dict(self.headers))
                with api._lock:
                    api.requests.append(request)
                handler = api.routes.get(parts.path)
                if handler is None:
                    matches = [p for p in api.prefix_routes if parts.path.startswith(p)]
                    handler = api.prefix_routes[max(matches, key=len)] if matches else None
                if handler is None:
                    status, body, headers = 404, {"error": f"no route {parts.path}"}, {}
                else:
                    status, body, *rest = handler(request)
                    headers = dict(rest[0]) if rest else {}
                if isinstance(body, (dict, list)):
                    data, ctype = json.dumps(body).encode(), "application/json"
                elif isinstance(body, str):
                    data, ctype = body.encode(), "text/plain"
                else:
                    data, ctype = body or b"", "application/octet-stream"
                ctype = headers.pop("Content-Type", ctype)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        class _Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:  # quiet
                pass

        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def route(self, path: str, handler: Handler, prefix: bool = False) -> None:
        (self.prefix_routes if prefix else self.routes)[path] = handler

    def count(self, path_prefix: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.path.startswith(path_prefix))

    def calls(self, path_prefix: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(path_prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sequence(*responses: Response) -> Handler:
    """Answer with the given responses in turn, repeating the last one."""
    state = {"i": 0}
    lock = threading.Lock()

    def handler(request: Request) -> Response:
        with lock:
            i = min(state["i"], len(responses) - 1)
            state["i"] += 1
        response = responses[i]
        return response(request) if callable(response) else response

    return handler


def slow(seconds: float, response: Response) -> Handler:
    def handler(request: Request) -> Response:
        time.sleep(seconds)
        return response

    return handler


# -- the services, as documented -------------------------------------------------------------------------------
def _em(kind: str, mode: str) -> Handler:
    def handler(request: Request) -> Response:
        if request.headers.get("auth-token") != EM_KEY:
            return 401, {"error": "Invalid authentication credentials"}
        zone = request.param("zone")
        name = f"electricitymaps_{kind}_{mode.replace('-', '_')}_{zone}.json"
        if not (PAYLOADS / name).exists():
            return 404, {"error": f"Zone '{zone}' does not exist."}
        return 200, payload(name)

    return handler


def _wt_login(request: Request) -> Response:
    expected = "Basic " + base64.b64encode(f"{WT_USER}:{WT_PASSWORD}".encode()).decode()
    if request.headers.get("Authorization") != expected:
        return 403, {"error": "invalid credentials"}
    return 200, {"token": WT_TOKEN}


def _wt(name: str) -> Handler:
    def handler(request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {WT_TOKEN}":
            return 401, {"error": "Unauthorized"}
        if request.param("region") != "CAISO_NORTH":  # only this region is recorded (and free to preview)
            return 403, {"error": "Unauthorized region", "message": "Your account does not have access to this region"}
        return 200, payload(name)

    return handler


def _ukci(name: str) -> Handler:
    def handler(request: Request) -> Response:
        return 200, payload(name)

    return handler


def eia_handler(request: Request) -> Response:
    if request.param("api_key") != EIA_KEY:
        return 403, {"error": {"code": "API_KEY_INVALID", "message": "An invalid api_key was supplied."}}
    offset = int(request.param("offset") or 0)
    name = {0: "eia930_fuel_type_data_CISO_page1.json", 30: "eia930_fuel_type_data_CISO_page2.json"}.get(offset)
    if name is None:
        body = payload("eia930_fuel_type_data_CISO_page2.json")
        body["response"]["data"] = []
        return 200, body
    return 200, payload(name)


EIA_PATH = "/v2/electricity/rto/fuel-type-data/data/"


def entsoe_handler(request: Request) -> Response:
    """A75/A16 documents for DE (a sample mix over the requested period); other zones: no matching data."""
    xml = {"Content-Type": "application/xml"}
    if request.param("securityToken") != ENTSOE_KEY:
        return 401, "<html><body><h1>Unauthorized</h1>Missing or invalid security token</body></html>", {}
    if (request.param("documentType"), request.param("processType")) != ("A75", "A16"):
        return 400, acknowledgement("check you request against dependency tables"), xml
    start = pd.Timestamp(request.param("periodStart"), tz="UTC")
    end = pd.Timestamp(request.param("periodEnd"), tz="UTC")
    if request.param("in_Domain") != DE_EIC:
        return 200, no_matching_data(request.param("in_Domain"), start, end), xml
    return 200, gl_market_document(DE_EIC, start, end, de_sample(start, end)), xml


def install_services(api: FakeApi) -> None:
    for kind in ("carbon_intensity", "power_breakdown"):
        for mode in ("past-range", "history"):
            api.route(f"/v3/{kind.replace('_', '-')}/{mode}", _em(kind, mode))
    api.route("/login", _wt_login)
    api.route("/v3/historical", _wt("watttime_historical_CAISO_NORTH.json"))
    api.route("/v3/forecast", _wt("watttime_forecast_CAISO_NORTH.json"))
    api.route("/v3/forecast/historical", _wt("watttime_forecast_historical_CAISO_NORTH.json"))
    api.route("/intensity/", _ukci("ukci_intensity_2021-07-01.json"), prefix=True)
    api.route("/generation/", _ukci("ukci_generation_2021-07-01.json"), prefix=True)
    api.route(EIA_PATH, eia_handler)
    api.route(ENTSOE_PATH, entsoe_handler)


# -- fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture
def api():
    server = FakeApi()
    install_services(server)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No real keys, no Airflow lookups, and the cache in a tmp dir, whatever the shell has."""
    for name in (
        "ELECTRICITYMAPS_API_KEY",
        "WATTTIME_USERNAME",
        "WATTTIME_PASSWORD",
        "EIA_API_KEY",
        "LIVE_FEEDS_CONFIG",
        "ELECTRICITYMAPS_BASE_URL",
        "WATTTIME_BASE_URL",
        "UKCI_BASE_URL",
        "EIA930_BASE_URL",
        "ENTSOE_API_KEY",
        "ENTSOE_BASE_URL",
        "AIRFLOW_CONN_ENTSOE_DEFAULT",
        "AIRFLOW_CONN_ELECTRICITYMAPS_DEFAULT",
        "AIRFLOW_CONN_WATTTIME_DEFAULT",
        "AIRFLOW_CONN_EIA_DEFAULT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONNECTORS_USE_AIRFLOW", "0")
    monkeypatch.setenv("HTTP_CACHE_DIR", str(tmp_path / "http-cache"))


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("ELECTRICITYMAPS_API_KEY", EM_KEY)
    monkeypatch.setenv("WATTTIME_USERNAME", WT_USER)
    monkeypatch.setenv("WATTTIME_PASSWORD", WT_PASSWORD)
    monkeypatch.setenv("EIA_API_KEY", EIA_KEY)
    monkeypatch.setenv("ENTSOE_API_KEY", ENTSOE_KEY)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def config(api, tmp_path):
    from warehouse.connectors.feeds import load_feed_config

    return (
        load_feed_config()
        .with_base_urls({name: api.url for name in ("electricitymaps", "watttime", "ukci", "eia930", "entsoe")})
        .with_http(
            connect_timeout_s=1.0,
            read_timeout_s=2.0,
            max_attempts=3,
            backoff_base_s=0.5,
            backoff_max_s=4.0,
            retry_after_max_s=30.0,
            cache_dir=str(tmp_path / "cache"),
        )
        .with_options("eia930", page_length=30)
    )


@pytest.fixture
def client(config, sleeps):
    """The real client; only its sleep is recorded instead of slept, so backoff costs no test time."""
    from warehouse.connectors.http import HttpClient

    http = HttpClient(config.http, sleep=sleeps.append)
    yield http
    http.close()


@pytest.fixture
def feeds(config, client, keys):
    from warehouse.connectors.feeds import LiveFeeds

    return LiveFeeds(config, client)
