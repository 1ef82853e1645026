"""Electricity Maps API v3: carbon intensity and power breakdown of a zone.

Endpoints (header `auth-token: <key>`):
* `/v3/carbon-intensity/history?zone=Z` (the last 24 h) or `/v3/carbon-intensity/past-range?zone=Z&start=..&end=..`
  (any period, at most 10 days per hourly request: the connector splits longer intervals). Response
  `{"zone": "DE", "history"|"data": [{"zone", "carbonIntensity", "datetime", "updatedAt", "createdAt",
  "emissionFactorType", "isEstimated", "estimationMethod"}]}`, gCO2eq/kWh.
* `/v3/power-breakdown/history` and `/v3/power-breakdown/past-range`: `powerProductionBreakdown` (MW by source:
  nuclear, geothermal, biomass, coal, wind, solar, hydro, gas, oil, unknown, "hydro discharge",
  "battery discharge"), besides the consumption/import/export breakdowns.

Signal recorded with each value:
* carbon intensity: `signal_type=average`, `basis=consumption` (Electricity Maps traces imports/exports and gives
  the intensity of the electricity *consumed* in the zone), `scope` = the payload's `emissionFactorType`
  (`lifecycle` is the API default; `emission_factor_type: direct` in feeds.yaml asks for direct), falling back to
  the requested value when a row does not say. Estimated rows carry `quality_flag=estimated`.
* generation: `powerProductionBreakdown` only (production), `gas` → `nat_gas`; storage discharge is not
  generation and is left out (like interconnector flows). Values are MW; sub-hourly data (when
  `temporal_granularity` asks for it) is averaged to the hour.
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import iso_z
from warehouse.connectors.base import Connector
from warehouse.connectors.schema import CARBON_INTENSITY, GENERATION, FeedData, chunks, frame, within
from warehouse.db import Rejection

SOURCE_TO_FUEL = {
    "nuclear": "nuclear",
    "geothermal": "geothermal",
    "biomass": "biomass",
    "coal": "coal",
    "wind": "wind",
    "solar": "solar",
    "hydro": "hydro",
    "gas": "nat_gas",
    "oil": "oil",
    "unknown": "unknown",
}
STORAGE_SOURCES = frozenset({"hydro discharge", "battery discharge"})


class ElectricityMapsConnector(Connector):
    name = "electricitymaps"

    def _headers(self) -> dict[str, str]:
        return {"auth-token": self.credentials()["api_key"]}

    def _records(self, kind: str, zone: str, start: pd.Timestamp, end: pd.Timestamp, extra: dict) -> list[dict]:
        mode = self.settings.option("mode", "past-range")
        if mode not in ("past-range", "history"):
            raise ValueError(f"electricitymaps: mode must be past-range or history, got {mode!r}")
        base = {"zone": zone, **extra}
        granularity = self.settings.option("temporal_granularity")
        if granularity:
            base["temporalGranularity"] = granularity
        if self.settings.option("disable_estimations"):
            base["disableEstimations"] = "true"
        if mode == "history":
            windows = [(None, None)]
        else:
            windows = chunks(start, end, pd.Timedelta(hours=int(self.settings.option("max_range_hours", 240))))
        records: list[dict] = []
        for window_start, window_end in windows:
            params = dict(base)
            if window_start is not None:
                params.update(start=iso_z(window_start), end=iso_z(window_end))
            body = self.get(f"/v3/{kind}/{mode}", params=params, headers=self._headers())
            if not isinstance(body, dict):
                raise self.payload_error(f"/v3/{kind}/{mode} returned {type(body).__name__}, expected an object")
            rows = body.get("history", body.get("data"))
            if not isinstance(rows, list):
                raise self.payload_error(f"/v3/{kind}/{mode} has no 'history' or 'data' list (keys {sorted(body)})")
            records.extend(rows)
        return records

    def carbon_intensity(self, data: FeedData, zone: str) -> pd.DataFrame:
        factor_type = self.settings.option("emission_factor_type", "lifecycle")
        records = self._records("carbon-intensity", zone, data.start, data.end, {"emissionFactorType": factor_type})
        rows = []
        for number, record in enumerate(records, start=1):
            problem = _check_record(record, zone, "carbonIntensity")
            if problem:
                data.add_rejection(CARBON_INTENSITY, _rejection(problem, number, record, "carbonIntensity", zone))
                continue
            scope = record.get("emissionFactorType") or factor_type
            if scope not in ("direct", "lifecycle"):
                data.add_rejection(
                    CARBON_INTENSITY,
                    _rejection(f"unknown emissionFactorType {scope!r}", number, record, "emissionFactorType", zone),
                )
                continue
            rows.append(
                {
                    "hour_utc": pd.Timestamp(record["datetime"]).tz_convert("UTC").floor("h"),
                    "value": float(record["carbonIntensity"]),
                    "scope": scope,
                    "estimated": bool(record.get("isEstimated")),
                }
            )
        if not rows:
            return frame(CARBON_INTENSITY, [])
        hourly = (
            pd.DataFrame(rows)
            .groupby(["hour_utc", "scope"], as_index=False)
            .agg(carbon_intensity_gco2_per_kwh=("value", "mean"), estimated=("estimated", "any"))
        )
        hourly["region"] = data.region
        hourly["signal_type"] = "average"
        hourly["basis"] = "consumption"
        hourly["data_source"] = self.name
        hourly["quality_flag"] = ["estimated" if e else None for e in hourly["estimated"]]
        return within(frame(CARBON_INTENSITY, hourly), data.start, data.end)

    def generation(self, data: FeedData, zone: str) -> pd.DataFrame:
        records = self._records("power-breakdown", zone, data.start, data.end, {})
        rows = []
        for number, record in enumerate(records, start=1):
            problem = _check_record(record, zone, "powerProductionBreakdown")
            breakdown = record.get("powerProductionBreakdown") if not problem else None
            if not problem and not isinstance(breakdown, dict):
                problem = "powerProductionBreakdown is not an object"
            if problem:
                data.add_rejection(GENERATION, _rejection(problem, number, record, "powerProductionBreakdown", zone))
                continue
            hour = pd.Timestamp(record["datetime"]).tz_convert("UTC").floor("h")
            estimated = bool(record.get("isEstimated"))
            for source, value in breakdown.items():
                if source in STORAGE_SOURCES or value is None:
                    continue
                fuel = SOURCE_TO_FUEL.get(source)
                if fuel is None:
                    data.add_rejection(
                        GENERATION,
                        _rejection(
                            f"unknown production source {source!r}",
                            number,
                            {"datetime": record["datetime"], source: value},
                            source,
                            zone,
                        ),
                    )
                    continue
                rows.append(
                    {
                        "hour_utc": hour,
                        "stamp": record["datetime"],
                        "fuel": fuel,
                        "value": float(value),
                        "estimated": estimated,
                    }
                )
        if not rows:
            return frame(GENERATION, [])
        per_stamp = (
            pd.DataFrame(rows)
            .groupby(["hour_utc", "stamp", "fuel"], as_index=False)
            .agg(value=("value", "sum"), estimated=("estimated", "any"))
        )
        hourly = per_stamp.groupby(["hour_utc", "fuel"], as_index=False).agg(
            generation_mw=("value", "mean"), estimated=("estimated", "any")
        )
        hourly["region"] = data.region
        hourly["data_source"] = self.name
        hourly["quality_flag"] = ["estimated" if e else None for e in hourly["estimated"]]
        return within(frame(GENERATION, hourly), data.start, data.end)

    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = FeedData(self.name, region, start, end)
        data.frames[CARBON_INTENSITY] = self.carbon_intensity(data, code)
        if self.settings.option("power_breakdown", True):
            data.frames[GENERATION] = self.generation(data, code)
        return data


def _check_record(record: object, zone: str, value_field: str) -> str | None:
    if not isinstance(record, dict):
        return "record is not an object"
    if record.get("zone") not in (None, zone):
        return f"zone {record.get('zone')!r} is not the requested {zone!r}"
    try:
        stamp = pd.Timestamp(record.get("datetime"))
    except (TypeError, ValueError):
        return "datetime is not a timestamp"
    if stamp is pd.NaT or stamp.tzinfo is None:
        return "datetime is missing or has no time zone"
    if record.get(value_field) is None:
        return f"{value_field} is null"
    if value_field == "carbonIntensity":
        try:
            value = float(record[value_field])
        except (TypeError, ValueError):
            return f"{value_field} is not a number"
        if value < 0:
            return f"{value_field} is negative"
    return None


def _rejection(reason: str, number: int, record: object, field_name: str, zone: str) -> Rejection:
    value = record.get(field_name) if isinstance(record, dict) else None
    return Rejection(
        reason=reason,
        file=f"electricitymaps:{zone}",
        row_number=number,
        field=field_name,
        value=None if value is None else str(value),
        record=record if isinstance(record, dict) else {"record": repr(record)},
    )
