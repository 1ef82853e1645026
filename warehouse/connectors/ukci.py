"""UK Carbon Intensity API (NESO, https://api.carbonintensity.org.uk; no key).

* `GET /intensity/{from}/{to}` (ISO 8601, e.g. `2021-07-01T00:00Z`; at most 14 days per request, longer intervals
  are split) → `{"data": [{"from", "to", "intensity": {"forecast", "actual", "index"}}]}`, half-hourly, gCO2/kWh.
* `GET /generation/{from}/{to}` → `{"data": [{"from", "to", "generationmix": [{"fuel", "perc"}]}]}`: the mix in
  percent (biomass, coal, imports, gas, nuclear, other, hydro, solar, wind).

Signal (from the API's methodology): the intensity is CO2 per kWh of electricity *consumed* in Great Britain:
it counts the large metered stations, embedded wind and solar, interconnector imports (each with its own factor)
and transmission/distribution losses, with operational (combustion-only) factors: nuclear, wind, solar and hydro
are 0. So `signal_type=average`, `basis=consumption`, `scope=direct`. The `actual` value (the estimate from
metered generation) is stored; half-hours without it (the future, or not yet settled) are not: forecasts of
unknown issue time do not belong in an actuals table. Two half-hours make an hour (their mean); an hour with
only one carries `quality_flag=partial_hour`.

The mix has no MW, only percent: it goes to `raw.grid_generation_share` (hourly mean of the half-hour
percentages) with `gas` → `nat_gas` and `imports` kept as its own row so the shares still sum to ~100. MW need
a total from another source (`share_pct / 100 * total_mw`).
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import utc as to_utc
from warehouse.connectors.base import Connector
from warehouse.connectors.schema import CARBON_INTENSITY, GENERATION_SHARE, FeedData, chunks, frame, within
from warehouse.db import Rejection

FUEL_NAMES = {"gas": "nat_gas"}  # the others (coal, biomass, nuclear, hydro, solar, wind, other, imports) keep theirs


def _path_time(ts: pd.Timestamp) -> str:
    return to_utc(ts).strftime("%Y-%m-%dT%H:%MZ")


class UKCarbonIntensityConnector(Connector):
    name = "ukci"
    needs_credentials = False

    def credentials(self) -> dict[str, str]:
        return {}

    def _records(self, kind: str, start: pd.Timestamp, end: pd.Timestamp) -> list[dict]:
        records: list[dict] = []
        span = pd.Timedelta(days=float(self.settings.option("max_range_days", 14)))
        for window_start, window_end in chunks(start, end, span):
            path = f"/{kind}/{_path_time(window_start)}/{_path_time(window_end)}"
            body = self.get(path)
            rows = body.get("data") if isinstance(body, dict) else None
            if not isinstance(rows, list):
                raise self.payload_error(f"{path} has no 'data' list")
            records.extend(rows)
        return records

    def _half_hour(self, data: FeedData, table: str, number: int, record: object, field: str) -> pd.Timestamp | None:
        try:
            return to_utc(record["from"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            data.add_rejection(
                table,
                Rejection(
                    "period 'from' missing or malformed",
                    f"ukci:{data.region}",
                    number,
                    "from",
                    None,
                    record if isinstance(record, dict) else {"record": repr(record)},
                ),
            )
            return None

    def carbon_intensity(self, data: FeedData) -> pd.DataFrame:
        rows = []
        for number, record in enumerate(self._records("intensity", data.start, data.end), start=1):
            stamp = self._half_hour(data, CARBON_INTENSITY, number, record, "from")
            if stamp is None:
                continue
            intensity = record.get("intensity")
            actual = intensity.get("actual") if isinstance(intensity, dict) else None
            if actual is None:
                continue  # not settled yet: only a forecast exists
            try:
                value = float(actual)
            except (TypeError, ValueError):
                value = -1.0
            if value < 0:
                data.add_rejection(
                    CARBON_INTENSITY,
                    Rejection(
                        "actual is not a non-negative number",
                        f"ukci:{data.region}",
                        number,
                        "intensity.actual",
                        str(actual),
                        record,
                    ),
                )
                continue
            rows.append({"hour_utc": stamp.floor("h"), "from": stamp, "value": value})
        if not rows:
            return frame(CARBON_INTENSITY, [])
        half_hours = pd.DataFrame(rows).drop_duplicates("from", keep="last")
        hourly = half_hours.groupby("hour_utc", as_index=False).agg(
            carbon_intensity_gco2_per_kwh=("value", "mean"), n=("value", "size")
        )
        hourly["quality_flag"] = ["partial_hour" if n < 2 else None for n in hourly["n"]]
        hourly["region"], hourly["data_source"] = data.region, self.name
        hourly["signal_type"], hourly["basis"], hourly["scope"] = "average", "consumption", "direct"
        return within(frame(CARBON_INTENSITY, hourly), data.start, data.end)

    def generation_share(self, data: FeedData) -> pd.DataFrame:
        rows = []
        for number, record in enumerate(self._records("generation", data.start, data.end), start=1):
            stamp = self._half_hour(data, GENERATION_SHARE, number, record, "from")
            if stamp is None:
                continue
            mix = record.get("generationmix")
            if not isinstance(mix, list):
                data.add_rejection(
                    GENERATION_SHARE,
                    Rejection(
                        "generationmix is not a list", f"ukci:{data.region}", number, "generationmix", None, record
                    ),
                )
                continue
            for item in mix:
                try:
                    fuel = str(item["fuel"]).strip().lower()
                    share = float(item["perc"])
                except (KeyError, TypeError, ValueError):
                    data.add_rejection(
                        GENERATION_SHARE,
                        Rejection(
                            "fuel or perc missing or malformed",
                            f"ukci:{data.region}",
                            number,
                            "generationmix",
                            str(item)[:200],
                            record,
                        ),
                    )
                    continue
                rows.append(
                    {"hour_utc": stamp.floor("h"), "from": stamp, "fuel": FUEL_NAMES.get(fuel, fuel), "share": share}
                )
        if not rows:
            return frame(GENERATION_SHARE, [])
        half_hours = pd.DataFrame(rows).groupby(["hour_utc", "from", "fuel"], as_index=False)["share"].sum()
        periods = half_hours.groupby("hour_utc")["from"].nunique().rename("n")
        # a fuel absent from one half-hour counts as 0 % there: divide by the hour's number of half-hours
        hourly = half_hours.groupby(["hour_utc", "fuel"], as_index=False)["share"].sum().join(periods, on="hour_utc")
        hourly["share_pct"] = hourly["share"] / hourly["n"]
        hourly["quality_flag"] = ["partial_hour" if n < 2 else None for n in hourly["n"]]
        hourly["region"], hourly["data_source"] = data.region, self.name
        return within(frame(GENERATION_SHARE, hourly), data.start, data.end)

    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = FeedData(self.name, region, start, end)
        data.frames[CARBON_INTENSITY] = self.carbon_intensity(data)
        if self.settings.option("generation", True):
            data.frames[GENERATION_SHARE] = self.generation_share(data)
        return data
