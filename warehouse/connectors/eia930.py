"""EIA-930 through the EIA API v2: hourly net generation by fuel of a balancing authority.

`GET /v2/electricity/rto/fuel-type-data/data/?api_key=K&frequency=hourly&data[0]=value&facets[respondent][]=CISO
&start=2021-07-01T01&end=2021-07-02T00&sort[0][column]=period&sort[0][direction]=asc&offset=0&length=5000`
→ `{"response": {"total": 48, "dateFormat": "YYYY-MM-DD\"T\"HH24", "frequency": "hourly", "data": [{"period":
"2021-07-01T05", "respondent": "CISO", "respondent-name": ..., "fueltype": "NG", "type-name": "Natural Gas",
"value": 7123, "value-units": "megawatthours"}], ...}, "request": {...}, "apiVersion": "2.1.x"}`. At most 5000
rows per page: the connector pages with `offset`/`length` until it has `response.total` rows (`total` and `value`
arrive as numbers or as strings, both accepted).

* Time: EIA-930 hourly periods are UTC and *hour-ending* (the period `T05` covers 04:00–05:00). The warehouse keys
  hours by their start (docs/data-contracts.md), so `hour_utc = period - 1 h` (`hour_ending: false` in
  feeds.yaml turns the shift off). NOTE: the file loader (warehouse/loaders/grid.py) keeps the EnsembleCI labels
  unshifted, so live CISO rows sit one hour earlier than file rows of the same EIA value.
* Generation: MWh in one hour = the hour's mean MW → `raw.grid_generation` (`generation_mw`). Fuel codes: COL coal,
  NG nat_gas, NUC nuclear, OIL oil, WAT hydro, SUN and SNB (solar with storage) solar, WND and WNB wind,
  GEO geothermal, OTH other, UNK unknown; storage (BAT, PS, OES) is not generation and is left out. Rows with a
  null value, an unknown code or another respondent go to quarantine.
* Carbon intensity: EIA publishes none, so it is derived from the mix with the same CarbonCast emission factors
  the file loader uses (`warehouse.loaders.grid_factors`: direct and lifecycle), negative net generation counted
  as 0: `signal_type=average`, `basis=production` (imports ignored), `scope` direct and lifecycle,
  `quality_flag=recomputed_from_mix`.
"""

from __future__ import annotations

import pandas as pd

from warehouse.connectors.base import Connector
from warehouse.connectors.schema import CARBON_INTENSITY, GENERATION, FeedData, frame, within
from warehouse.db import Rejection

# one table of factors for the files and the live feeds
from warehouse.loaders.grid_factors import CARBONCAST_DIRECT as DIRECT_FACTORS
from warehouse.loaders.grid_factors import CARBONCAST_LIFECYCLE as LIFECYCLE_FACTORS

FUEL_CODES = {
    "COL": "coal",
    "NG": "nat_gas",
    "NUC": "nuclear",
    "OIL": "oil",
    "WAT": "hydro",
    "SUN": "solar",
    "SNB": "solar",
    "WND": "wind",
    "WNB": "wind",
    "GEO": "geothermal",
    "OTH": "other",
    "UNK": "unknown",
}
STORAGE_CODES = frozenset({"BAT", "PS", "OES"})
MAX_PAGE_LENGTH = 5000
PATH = "/v2/electricity/rto/fuel-type-data/data/"


def _period(ts: pd.Timestamp) -> str:
    return ts.strftime("%Y-%m-%dT%H")


class EIA930Connector(Connector):
    name = "eia930"

    def _shift(self) -> pd.Timedelta:
        return pd.Timedelta(hours=1) if self.settings.option("hour_ending", True) else pd.Timedelta(0)

    def _pages(self, respondent: str, start: pd.Timestamp, end: pd.Timestamp) -> list[dict]:
        length = min(int(self.settings.option("page_length", MAX_PAGE_LENGTH)), MAX_PAGE_LENGTH)
        max_pages = int(self.settings.option("max_pages", 1000))
        shift = self._shift()
        # [start, end) in hour starts = periods start+shift .. end-1h+shift, both inclusive for EIA
        base = [
            ("api_key", self.credentials()["api_key"]),
            ("frequency", "hourly"),
            ("data[0]", "value"),
            ("facets[respondent][]", respondent),
            ("start", _period(start + shift)),
            ("end", _period(end - pd.Timedelta(hours=1) + shift)),
            ("sort[0][column]", "period"),
            ("sort[0][direction]", "asc"),
            ("sort[1][column]", "fueltype"),
            ("sort[1][direction]", "asc"),
        ]
        rows: list[dict] = []
        offset, total = 0, None
        for _ in range(max_pages):
            body = self.get(PATH, params=base + [("offset", offset), ("length", length)])
            response = body.get("response") if isinstance(body, dict) else None
            if not isinstance(response, dict) or not isinstance(response.get("data"), list):
                raise self.payload_error(f"{PATH} has no response.data list")
            try:
                total = int(response.get("total"))
            except (TypeError, ValueError):
                raise self.payload_error(f"{PATH} response.total {response.get('total')!r} is not a count") from None
            page = response["data"]
            rows.extend(page)
            offset += len(page)
            if not page or offset >= total:
                break
        else:
            raise self.payload_error(f"{PATH}: more than {max_pages} pages of {length} rows; narrow the interval")
        if total is not None and len(rows) < total:
            raise self.payload_error(f"{PATH}: got {len(rows)} of response.total={total} rows (a page came back short)")
        return rows

    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = FeedData(self.name, region, start, end)
        shift = self._shift()
        rows = []
        for number, record in enumerate(self._pages(code, start, end), start=1):
            where = f"eia930:{code}"
            if not isinstance(record, dict):
                data.add_rejection(
                    GENERATION,
                    Rejection("record is not an object", where, number, None, None, {"record": repr(record)}),
                )
                continue
            fueltype = str(record.get("fueltype", "")).upper()
            problem, field, value = None, None, None
            if record.get("respondent") not in (None, code):
                problem, field, value = f"respondent is not {code}", "respondent", record.get("respondent")
            elif fueltype in STORAGE_CODES:
                continue
            elif fueltype not in FUEL_CODES:
                problem, field, value = "unknown fueltype code", "fueltype", fueltype
            else:
                try:
                    hour = pd.Timestamp(str(record["period"])).tz_localize("UTC") - shift
                except (KeyError, TypeError, ValueError):
                    problem, field, value = "period missing or malformed", "period", record.get("period")
                else:
                    raw = record.get("value")
                    try:
                        mw = float(raw)
                    except (TypeError, ValueError):
                        problem, field, value = "value is null or not a number", "value", raw
                    else:
                        if mw != mw:
                            problem, field, value = "value is NaN", "value", raw
            if problem:
                data.add_rejection(
                    GENERATION, Rejection(problem, where, number, field, None if value is None else str(value), record)
                )
                continue
            rows.append({"hour_utc": hour, "fuel": FUEL_CODES[fueltype], "generation_mw": mw})
        if not rows:
            data.frames[GENERATION] = frame(GENERATION, [])
            data.frames[CARBON_INTENSITY] = frame(CARBON_INTENSITY, [])
            return data
        generation = pd.DataFrame(rows).groupby(["hour_utc", "fuel"], as_index=False)["generation_mw"].sum()
        generation["region"], generation["data_source"] = region, self.name
        data.frames[GENERATION] = within(frame(GENERATION, generation), start, end)
        data.frames[CARBON_INTENSITY] = within(self._intensity(region, generation), start, end)
        return data

    def _intensity(self, region: str, generation: pd.DataFrame) -> pd.DataFrame:
        mix = generation.pivot(index="hour_utc", columns="fuel", values="generation_mw").fillna(0.0).clip(lower=0.0)
        frames = []
        for scope, factors in (("direct", DIRECT_FACTORS), ("lifecycle", LIFECYCLE_FACTORS)):
            weights = pd.Series({fuel: factors[fuel] for fuel in mix.columns})
            total = mix.sum(axis=1)
            ci = (mix * weights).sum(axis=1) / total.where(total > 0)
            part = ci.dropna().rename("carbon_intensity_gco2_per_kwh").reset_index()
            part["scope"] = scope
            frames.append(part)
        rows = pd.concat(frames, ignore_index=True)
        rows["region"], rows["data_source"] = region, self.name
        rows["signal_type"], rows["basis"], rows["quality_flag"] = "average", "production", "recomputed_from_mix"
        return frame(CARBON_INTENSITY, rows)
