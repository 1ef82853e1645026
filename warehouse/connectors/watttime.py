"""WattTime API v3: marginal emissions (MOER), historical and forecast.

* `GET /login` with HTTP basic auth (username, password) → `{"token": ...}` (valid 30 minutes; kept in memory for
  `token_ttl_s`, renewed once on a 401). Data requests send `Authorization: Bearer <token>`.
* `GET /v3/historical?region=R&start=..&end=..&signal_type=co2_moer` (at most 32 days per request; the
  connector splits longer intervals) → `{"data": [{"point_time", "value"}], "meta": {"region", "signal_type",
  "units", "data_point_period_seconds", "model", "warnings", ...}}`.
* `GET /v3/forecast?region=R&signal_type=co2_moer&horizon_hours=H` → the latest forecast, `meta.generated_at`
  saying when it was issued; `GET /v3/forecast/historical?region=R&start=..&end=..` → `{"data": [{"generated_at",
  "forecast": [{"point_time", "value"}]}], "meta": ...}`, the forecasts issued in [start, end]
  (`forecast_mode: historical` picks the latest one issued at or before `as_of`, for replays).

Units: `meta.units` `lbs_co2_per_mwh` → × 0.45359237 (1 lb/MWh = 453.59237 g / 1000 kWh) to gCO2/kWh;
`kg_co2_per_mwh` and `g_co2_per_kwh` are already g/kWh.

Signal recorded with each value: `co2_moer` → `signal_type=marginal`, `basis=production` (the emission rate of
the generators that respond to a change in load), `scope=direct` (stack CO2, no lifecycle); `co2_aoer` →
`average`, `production`, `direct`. Five-minute points become the hourly mean; an hour with fewer points than
3600 / `data_point_period_seconds` carries `quality_flag=partial_hour`. Historical values go to
`raw.grid_carbon_intensity`; forecasts to `raw.grid_live_forecasts` with `issued_at` = `generated_at`.
"""

from __future__ import annotations

import time

import pandas as pd

from common.timeutil import iso_z
from common.timeutil import utc as to_utc
from warehouse.connectors.base import Connector
from warehouse.connectors.http import HttpStatusError, register_secret
from warehouse.connectors.schema import CARBON_INTENSITY, LIVE_FORECASTS, FeedData, chunks, frame, within
from warehouse.db import Rejection

LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
UNIT_FACTORS = {"lbs_co2_per_mwh": LBS_PER_MWH_TO_G_PER_KWH, "kg_co2_per_mwh": 1.0, "g_co2_per_kwh": 1.0}
SIGNALS = {  # WattTime signal_type -> (signal_type, basis, scope)
    "co2_moer": ("marginal", "production", "direct"),
    "co2_aoer": ("average", "production", "direct"),
}


class WattTimeConnector(Connector):
    name = "watttime"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._token: str | None = None
        self._token_at = 0.0

    # -- auth ------------------------------------------------------------------------------------------------
    def _login(self) -> str:
        creds = self.credentials()
        body = self.get("/login", auth=(creds["username"], creds["password"]), use_cache=False)
        token = body.get("token") if isinstance(body, dict) else None
        if not token:
            raise self.payload_error("/login returned no 'token'")
        register_secret(token)
        self._token, self._token_at = token, time.monotonic()
        return token

    def _token_value(self) -> str:
        if self._token is None or time.monotonic() - self._token_at > float(self.settings.option("token_ttl_s", 1500)):
            return self._login()
        return self._token

    def _get_authorized(self, path: str, params: dict, cache_ttl_s=None) -> dict:
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self._token_value()}"}
            try:
                body = self.get(path, params=params, headers=headers, cache_ttl_s=cache_ttl_s)
            except HttpStatusError as exc:
                if exc.status == 401 and attempt == 1:
                    self._token = None  # expired: log in again once
                    continue
                raise
            if not isinstance(body, dict):
                raise self.payload_error(f"{path} returned {type(body).__name__}, expected an object")
            return body
        raise AssertionError("unreachable")

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
        max_days = float(self.settings.option("max_range_days", 30))
        for window_start, window_end in chunks(start, end, pd.Timedelta(days=max_days)):
            params = {
                "region": code,
                "start": iso_z(window_start),
                "end": iso_z(window_end),
                "signal_type": self._signal(),
            }
            body = self._get_authorized("/v3/historical", params)
            factor, (signal_type, basis, scope), period = self._meta(body, "/v3/historical")
            points = self._points(data, CARBON_INTENSITY, body.get("data"), "/v3/historical", factor)
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
        params = {"region": code, "signal_type": self._signal(), "horizon_hours": horizon}
        if mode == "latest":
            path = "/v3/forecast"
            ttl = float(self.settings.option("forecast_cache_ttl_s", 300))
            body = self._get_authorized(path, params, cache_ttl_s=ttl)
            generated_at = (body.get("meta") or {}).get("generated_at")
            runs = [{"generated_at": generated_at, "forecast": body.get("data")}]
        elif mode == "historical":
            path = "/v3/forecast/historical"
            lookback = pd.Timedelta(minutes=float(self.settings.option("forecast_lookback_minutes", 60)))
            params.update(start=iso_z(as_of - lookback), end=iso_z(as_of))
            body = self._get_authorized(path, params)
            runs = body.get("data")
            if not isinstance(runs, list):
                raise self.payload_error(f"{path} 'data' is not a list")
        else:
            raise ValueError(f"watttime: forecast_mode must be latest or historical, got {mode!r}")
        factor, (signal_type, basis, scope), period = self._meta(body, path)
        issued = []
        for run in runs:
            try:
                issued.append((to_utc(run["generated_at"]), run))
            except (KeyError, TypeError, ValueError):
                raise self.payload_error(f"{path} forecast without a valid generated_at") from None
        if mode == "historical":
            issued = [item for item in issued if item[0] <= as_of]
        data = FeedData(self.name, region, as_of, as_of + pd.Timedelta(hours=horizon))
        if not issued:
            data.frames[LIVE_FORECASTS] = frame(LIVE_FORECASTS, [])
            return data
        issued_at, run = max(issued, key=lambda item: item[0])
        points = self._points(data, LIVE_FORECASTS, run.get("forecast"), path, factor)
        rows = self._hourly(points, period) if len(points) else pd.DataFrame()
        if len(rows):
            rows["region"], rows["issued_at"], rows["data_source"] = region, issued_at, self.name
            rows["signal_type"], rows["basis"], rows["scope"] = signal_type, basis, scope
        data.frames[LIVE_FORECASTS] = frame(LIVE_FORECASTS, rows)
        return data
