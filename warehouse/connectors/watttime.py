"""WattTime API v3 through the official `watttime` SDK: marginal emissions (MOER), historical and forecast.

Endpoints: `get_historical_jsons` (`/v3/historical`, ≤ 30 days a request: longer intervals are split),
`get_forecast_json` (`/v3/forecast`, the latest run, issued at `meta.generated_at`) and
`get_historical_forecast_json` (`/v3/forecast/historical`, the runs issued in [start, end]; `forecast_mode:
historical` picks the latest one issued at or before `as_of`, for replays). Payload: `{"data": [{"point_time",
"value"}] (forecast history: [{"generated_at", "forecast": [...]}]), "meta": {"signal_type", "units",
"data_point_period_seconds", "model", ...}}`.

The SDK's session gets `base_url`, the feeds' timeouts and no retries of its own: `HttpClient.call` applies the
shared policy, the shared cache holds the bodies, and a 401 renews the token once. Its login is replaced only to
keep the password on the instance (the SDK's reads it from, and writes it to, os.environ: every child process
would inherit it).

Units: `meta.units` `lbs_co2_per_mwh` → × 0.45359237 (1 lb/MWh = 453.59237 g / 1000 kWh) to gCO2/kWh;
`kg_co2_per_mwh` and `g_co2_per_kwh` are already g/kWh.

Signal recorded with each value: `co2_moer` → `signal_type=marginal`, `basis=production` (the emission rate of
the generators that respond to a change in load), `scope=direct` (stack CO2, no lifecycle); `co2_aoer` →
`average`, `production`, `direct`. Five-minute points become the hourly mean; an hour with fewer points than
3600 / `data_point_period_seconds` carries `quality_flag=partial_hour`. Historical values go to
`raw.grid_carbon_intensity`; forecasts to `raw.grid_live_forecasts` with `issued_at` = `generated_at`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import requests
from requests.adapters import HTTPAdapter

from common.timeutil import utc as to_utc
from warehouse.connectors.base import Connector
from warehouse.connectors.http import HttpSettings, HttpStatusError, redact_url, register_secret
from warehouse.connectors.schema import CARBON_INTENSITY, LIVE_FORECASTS, FeedData, chunks, frame, within
from warehouse.db import Rejection

LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
UNIT_FACTORS = {"lbs_co2_per_mwh": LBS_PER_MWH_TO_G_PER_KWH, "kg_co2_per_mwh": 1.0, "g_co2_per_kwh": 1.0}
SIGNALS = {  # WattTime signal_type -> (signal_type, basis, scope)
    "co2_moer": ("marginal", "production", "direct"),
    "co2_aoer": ("average", "production", "direct"),
}


class _FeedAdapter(HTTPAdapter):
    """No retries of its own (HttpClient.call applies the feeds' policy) and the feeds' (connect, read) timeouts."""

    def __init__(self, timeout: tuple[float, float]):
        super().__init__(max_retries=0)
        self.timeout = timeout

    def send(self, request, **kwargs):
        kwargs["timeout"] = self.timeout
        return super().send(request, **kwargs)


@functools.cache
def _sdk_client_class() -> type:
    """The SDK's historical + forecast client, imported on first use.

    Importing `watttime` calls `logging.basicConfig` on the root logger; a handler or level it sets on a host
    that has not configured logging yet is undone, so the host's own configuration still takes effect.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from watttime import WattTimeForecast, WattTimeHistorical  # noqa: PLC0415 - see the docstring

    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)

    class SdkClient(WattTimeHistorical, WattTimeForecast):
        def __init__(self, username: str, password: str, base_url: str, http: HttpSettings, token_ttl_s: float):
            super().__init__()  # no username/password here: the SDK would put them into os.environ
            self.url_base = base_url.rstrip("/")
            self._basic_auth = requests.auth.HTTPBasicAuth(username, password)
            self._token_ttl = timedelta(seconds=token_ttl_s)
            adapter = _FeedAdapter((http.connect_timeout_s, http.read_timeout_s))
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            self.session.headers["User-Agent"] = http.user_agent

        def _login(self) -> None:
            response = self.session.get(f"{self.url_base}/login", auth=self._basic_auth)
            response.raise_for_status()
            token = response.json().get("token")
            if not token:
                raise ValueError("/login returned no 'token'")
            register_secret(token)
            self.token, self.token_valid_until = token, datetime.now() + self._token_ttl
            self.headers = {"Authorization": f"Bearer {token}", "User-Agent": self.session.headers["User-Agent"]}

        def logged_in(self) -> bool:
            return bool(self.headers) and self._is_token_valid()

        def forget_token(self) -> None:
            self.token = self.headers = self.token_valid_until = None

    return SdkClient


class WattTimeConnector(Connector):
    name = "watttime"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._client: Any = None

    # -- transport -------------------------------------------------------------------------------------------
    def _sdk(self) -> Any:
        if self._client is None:
            creds = self.credentials()
            self._client = _sdk_client_class()(
                creds["username"],
                creds["password"],
                self.settings.base_url,
                self.client.settings,
                float(self.settings.option("token_ttl_s", 1500)),
            )
        return self._client

    def _call(self, path: str, params: dict, request: Callable[[Any], Any], cache_ttl_s=None) -> Any:
        """`request(sdk)` under the shared retry policy and response cache; a 401 logs in again once."""
        url = self.url(path)
        ttl = cache_ttl_s if cache_ttl_s is not None else self.settings.cache_ttl_s
        return self.client.cached(url, params, lambda: self._fetch(path, url, params, request), ttl, self.name)

    def _fetch(self, path: str, url: str, params: dict, request: Callable[[Any], Any]) -> Any:
        shown = redact_url(url, params)
        sdk = self._sdk()

        def send() -> Any:
            try:
                return request(sdk)
            except RuntimeError as exc:  # the SDK wraps requests' errors of data requests in RuntimeError
                cause = exc.__cause__
                if isinstance(cause, requests.exceptions.JSONDecodeError):
                    raise self.payload_error(f"{path} returned a body that is not JSON") from None
                if isinstance(cause, requests.RequestException):
                    raise cause from None
                raise
            except (KeyError, TypeError, AttributeError, ValueError) as exc:  # the SDK indexes meta.model.date
                raise self.payload_error(f"{path}: {type(exc).__name__}: {exc}") from None

        def login() -> None:
            try:
                sdk._login()
            except ValueError as exc:  # a body that is not JSON, or one without a token
                raise self.payload_error(f"/login: {exc}") from None

        for attempt in (1, 2):
            try:
                if not sdk.logged_in():  # on its own, so that a failed login is reported as one
                    self.client.call(login, shown=redact_url(self.url("/login")), feed=self.name)
                body = self.client.call(send, shown=shown, feed=self.name)
            except HttpStatusError as exc:
                if exc.status == 401 and attempt == 1:
                    sdk.forget_token()  # expired: log in again once
                    continue
                raise
            return body
        raise AssertionError("unreachable")

    def _responses(self, path: str, body: Any) -> list[dict]:
        responses = body if isinstance(body, list) else [body]
        for response in responses:
            if not isinstance(response, dict):
                raise self.payload_error(f"{path} returned {type(response).__name__}, expected an object")
        if not responses:
            raise self.payload_error(f"{path} returned no response")
        return responses

    # -- parsing ---------------------------------------------------------------------------------------------
    def _signal(self) -> str:
        signal = self.settings.option("signal_type", "co2_moer")
        if signal not in SIGNALS:
            raise ValueError(
                f"watttime: signal_type {signal!r} is not a carbon intensity; use one of {sorted(SIGNALS)}"
            )
        return signal

    def _meta(self, body: dict, path: str) -> tuple[float, tuple[str, str, str], int]:
        meta = body.get("meta")
        if not isinstance(meta, dict):
            raise self.payload_error(f"{path} has no 'meta' object")
        units = meta.get("units")
        if units not in UNIT_FACTORS:
            raise self.payload_error(f"{path} meta.units {units!r} is not one of {sorted(UNIT_FACTORS)}")
        signal = meta.get("signal_type", self._signal())
        if signal not in SIGNALS:
            raise self.payload_error(f"{path} meta.signal_type {signal!r} is not one of {sorted(SIGNALS)}")
        period = int(meta.get("data_point_period_seconds") or 300)
        return UNIT_FACTORS[units], SIGNALS[signal], period

    def _points(self, data: FeedData, table: str, points: object, path: str, factor: float) -> pd.DataFrame:
        if not isinstance(points, list):
            raise self.payload_error(f"{path} 'data' is not a list")
        rows = []
        for number, point in enumerate(points, start=1):
            problem = None
            if not isinstance(point, dict):
                problem, point = "point is not an object", {"point": repr(point)}
            else:
                try:
                    stamp = to_utc(point["point_time"])
                    value = float(point["value"])
                except (KeyError, TypeError, ValueError):
                    problem = "point_time or value missing or malformed"
            if problem:
                data.add_rejection(
                    table,
                    Rejection(problem, f"watttime:{data.region}:{path}", number, "value", None, point),
                )
                continue
            rows.append({"hour_utc": stamp.floor("h"), "value": value * factor})
        return pd.DataFrame(rows, columns=["hour_utc", "value"])

    @staticmethod
    def _hourly(points: pd.DataFrame, period_s: int) -> pd.DataFrame:
        hourly = points.groupby("hour_utc", as_index=False).agg(
            carbon_intensity_gco2_per_kwh=("value", "mean"), n=("value", "size")
        )
        expected = max(1, 3600 // max(1, period_s))
        hourly["quality_flag"] = ["partial_hour" if n < expected else None for n in hourly["n"]]
        return hourly.drop(columns="n")

    # -- endpoints -------------------------------------------------------------------------------------------
    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = FeedData(self.name, region, start, end)
        frames = []
        signal = self._signal()
        max_days = float(self.settings.option("max_range_days", 30))
        path = "/v3/historical"
        for window_start, window_end in chunks(start, end, pd.Timedelta(days=max_days)):
            first, last = window_start.to_pydatetime(), window_end.to_pydatetime()
            params = {"region": code, "start": first.isoformat(), "end": last.isoformat(), "signal_type": signal}
            body = self._call(
                path, params, lambda sdk, first=first, last=last: sdk.get_historical_jsons(first, last, code, signal)
            )
            for response in self._responses(path, body):
                factor, (signal_type, basis, scope), period = self._meta(response, path)
                points = self._points(data, CARBON_INTENSITY, response.get("data"), path, factor)
                if len(points):
                    hourly = self._hourly(points, period)
                    hourly["signal_type"], hourly["basis"], hourly["scope"] = signal_type, basis, scope
                    frames.append(hourly)
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if len(rows):
            rows = rows.drop_duplicates(["hour_utc", "signal_type"], keep="last")
            rows["region"], rows["data_source"] = region, self.name
        data.frames[CARBON_INTENSITY] = within(frame(CARBON_INTENSITY, rows), start, end)
        return data

    def forecast(self, region: str, code: str, as_of: pd.Timestamp) -> FeedData:
        """The forecast known at `as_of` (mode `historical`), or the latest one (mode `latest`, live runs)."""
        as_of = to_utc(as_of)
        horizon = int(self.settings.option("horizon_hours", 24))
        mode = self.settings.option("forecast_mode", "latest")
        signal = self._signal()
        params: dict[str, Any] = {"region": code, "signal_type": signal, "horizon_hours": horizon}
        if mode == "latest":
            path = "/v3/forecast"
            ttl = float(self.settings.option("forecast_cache_ttl_s", 300))
            body = self._call(
                path, params, lambda sdk: sdk.get_forecast_json(code, signal, horizon_hours=horizon), cache_ttl_s=ttl
            )
            responses = self._responses(path, body)
            runs = [
                (
                    response,
                    {
                        "generated_at": (response.get("meta") or {}).get("generated_at"),
                        "forecast": response.get("data"),
                    },
                )
                for response in responses
            ]
        elif mode == "historical":
            path = "/v3/forecast/historical"
            lookback = pd.Timedelta(minutes=float(self.settings.option("forecast_lookback_minutes", 60)))
            first, last = (as_of - lookback).to_pydatetime(), as_of.to_pydatetime()
            params.update(start=first.isoformat(), end=last.isoformat())
            body = self._call(
                path,
                params,
                lambda sdk: sdk.get_historical_forecast_json(first, last, code, signal, horizon_hours=horizon),
            )
            runs = []
            for response in self._responses(path, body):
                if not isinstance(response.get("data"), list):
                    raise self.payload_error(f"{path} 'data' is not a list")
                runs.extend((response, run) for run in response["data"])
        else:
            raise ValueError(f"watttime: forecast_mode must be latest or historical, got {mode!r}")
        issued = []
        for response, run in runs:
            try:
                issued.append((to_utc(run["generated_at"]), response, run))
            except (KeyError, TypeError, ValueError):
                raise self.payload_error(f"{path} forecast without a valid generated_at") from None
        if mode == "historical":
            issued = [item for item in issued if item[0] <= as_of]
        data = FeedData(self.name, region, as_of, as_of + pd.Timedelta(hours=horizon))
        if not issued:
            data.frames[LIVE_FORECASTS] = frame(LIVE_FORECASTS, [])
            return data
        issued_at, response, run = max(issued, key=lambda item: item[0])
        factor, (signal_type, basis, scope), period = self._meta(response, path)
        points = self._points(data, LIVE_FORECASTS, run.get("forecast"), path, factor)
        rows = self._hourly(points, period) if len(points) else pd.DataFrame()
        if len(rows):
            rows["region"], rows["issued_at"], rows["data_source"] = region, issued_at, self.name
            rows["signal_type"], rows["basis"], rows["scope"] = signal_type, basis, scope
        data.frames[LIVE_FORECASTS] = frame(LIVE_FORECASTS, rows)
        return data
