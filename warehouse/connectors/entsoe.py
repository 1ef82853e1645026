"""ENTSO-E Transparency Platform through entsoe-py: actual generation per production type of a bidding zone.

* Request: entsoe-py's `EntsoeRawClient.query_generation` (documentType A75, processType A16, `in_Domain` = the
  zone's EIC code from `entsoe.mappings.lookup_area`, periodStart/periodEnd in UTC, `securityToken` = the free
  key). The library does the HTTP and returns the XML text; its endpoint is the module global `entsoe.entsoe.URL`,
  set here to the feed's `base_url` + `/api` for the duration of each request (so tests point it at 127.0.0.1).
* Response: a `GL_MarketDocument`, one `TimeSeries` per production type (`MktPSRType/psrType` B01..B20) and
  direction (`inBiddingZone_Domain` = generation, `outBiddingZone_Domain` = consumption, e.g. pumping), each with
  `Period`s of PT15M/PT30M/PT60M `Point`s in MW (`quantity_Measure_Unit.name` MAW). An
  `Acknowledgement_MarketDocument` whose reason says "No matching data found" means no data for the interval.
  The document is checked with ElementTree (well-formed, A75, MAW on every series) and then parsed with
  `entsoe.parsers.parse_generation`.
* Generation: the hourly mean of each production type's points → `raw.grid_generation` (`generation_mw`), psr
  types mapped onto the contract's fuels by `PSR_FUELS`, grouped as Electricity Maps' ENTSO-E parser groups
  them (lignite, hard coal, oil shale, peat → coal; coal-derived gas → nat_gas; waste → biomass; marine, other
  renewable, other → unknown), which gives the fuel set of the EnsembleCI EU files (`unknown`, no `other`).
  Pumped storage (B10) and other storage are not generation and are left out; consumption series are not
  generation either. An hour with fewer points than the series' resolution implies is flagged `partial_hour`.
* Carbon intensity: ENTSO-E publishes none, so it is computed from the hourly mix with the CarbonCast direct
  factors (`warehouse.loaders.grid_factors.intensity_from_mix`, as the file loader does), negative values counted
  as 0: `signal_type=average`, `basis=production` (imports ignored), `scope=direct`,
  `quality_flag=recomputed_from_mix` (plus `partial_hour`, and `partial_mix` when a production type that reports
  elsewhere in the fetched period has no value in that hour). The fetched period starts `context_hours` (24)
  before the interval, so even an hourly run knows which types the zone reports and at what resolution; only
  the interval's hours are returned.
* Requests run under the HTTP client's retry policy (`HttpClient.call`): 429 (honouring `Retry-After`), 5xx,
  timeouts and connection errors are retried with the client's backoff, then `RateLimitedError` /
  `HttpStatusError` / `TransportError`; other 4xx → `HttpStatusError` at once with the acknowledgement's reason
  (entsoe-py's parameter errors as 400); malformed XML, another document type or unit → `PayloadError`; "No
  matching data" → no rows, so `LiveFeeds` raises `EmptyFeedError` and the fallback serves. Successful documents
  are cached as text in the client's response cache (the token is not part of the key).
"""

from __future__ import annotations

import logging
import threading
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Mapping

import entsoe.entsoe as entsoe_api
import pandas as pd
import requests
from bs4 import XMLParsedAsHTMLWarning
from entsoe import EntsoeRawClient
from entsoe.exceptions import (
    InvalidBusinessParameterError,
    InvalidParameterError,
    InvalidPSRTypeError,
    NoMatchingDataError,
    PaginationError,
)
from entsoe.mappings import PSRTYPE_MAPPINGS, lookup_area
from entsoe.parsers import parse_generation

from common.timeutil import iso_z
from warehouse.connectors.base import Connector, FeedSettings
from warehouse.connectors.http import (
    HttpClient,
    HttpStatusError,
    PayloadError,
    RateLimitedError,
    cache_key,
    redact,
    redact_url,
    register_secret,
)
from warehouse.connectors.schema import CARBON_INTENSITY, GENERATION, FeedData, chunks, frame, join_flags, within
from warehouse.db import Rejection
from warehouse.loaders.grid_factors import CARBONCAST_DIRECT, intensity_from_mix

log = logging.getLogger("warehouse.connectors")

PSR_FUELS: dict[str, str] = {
    "B01": "biomass",
    "B02": "coal",  # Fossil Brown coal/Lignite
    "B03": "nat_gas",  # Fossil Coal-derived gas
    "B04": "nat_gas",
    "B05": "coal",  # Fossil Hard coal
    "B06": "oil",
    "B07": "coal",  # Fossil Oil shale
    "B08": "coal",  # Fossil Peat
    "B09": "geothermal",
    "B11": "hydro",  # Run-of-river and poundage
    "B12": "hydro",  # Water Reservoir
    "B13": "unknown",  # Marine
    "B14": "nuclear",
    "B15": "unknown",  # Other renewable
    "B16": "solar",
    "B17": "biomass",  # Waste
    "B18": "wind",  # Offshore
    "B19": "wind",  # Onshore
    "B20": "unknown",  # Other
}
STORAGE_PSR = frozenset({"B10", "B25"})  # pumped storage, energy storage
PSR_BY_NAME = {name: code for code, name in PSRTYPE_MAPPINGS.items()}
UNIT = "MAW"  # megawatt
DOCUMENT_TYPE = "A75"
HOUR = pd.Timedelta(hours=1)
NO_DATA = "No matching data found"
_ENDPOINT_LOCK = threading.Lock()


class _Redact(logging.Filter):
    """entsoe-py logs each request's parameters, the security token included: mask it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


for _name in ("entsoe.entsoe", "entsoe.decorators"):
    logging.getLogger(_name).addFilter(_Redact())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child_text(element: ET.Element, name: str) -> str | None:
    for child in element.iter():
        if _local(child.tag) == name:
            return (child.text or "").strip()
    return None


class EntsoeConnector(Connector):
    name = "entsoe"

    def __init__(self, client: HttpClient, settings: FeedSettings, credentials: Mapping[str, str] | None = None):
        super().__init__(client, settings, credentials)
        self._raw: EntsoeRawClient | None = None

    def _endpoint(self) -> str:
        return self.url(str(self.settings.option("path", "/api")))

    def _raw_client(self) -> EntsoeRawClient:
        if self._raw is None:
            token = self.credentials()["api_key"]
            register_secret(token)
            http = self.client.settings
            self._raw = EntsoeRawClient(
                api_key=token,
                session=requests.Session(),
                retry_count=1,  # retries are ours (the client's policy), not the library's fixed sleeps
                retry_delay=0,
                timeout=(http.connect_timeout_s, http.read_timeout_s),
            )
        return self._raw

    def _request(self, area, start: pd.Timestamp, end: pd.Timestamp, shown: str) -> str | None:
        """One A75 document as XML text, or None when ENTSO-E has no matching data; under the client's retry policy."""
        reasons: list[str] = []  # the acknowledgement's reason of the last HTTP error, for the 4xx message

        def send() -> str | None:
            with _ENDPOINT_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)  # bs4 reads error bodies as HTML
                previous, entsoe_api.URL = entsoe_api.URL, self._endpoint()
                try:
                    return self._raw_client().query_generation(area, start=start, end=end)
                except NoMatchingDataError:
                    return None
                except (InvalidBusinessParameterError, InvalidPSRTypeError, InvalidParameterError) as exc:
                    raise HttpStatusError(
                        f"{self.name}: GET {shown} rejected the request ({type(exc).__name__})", 400, shown
                    ) from None
                except PaginationError as exc:
                    message = f"{self.name}: GET {shown}: {exc}; lower max_range_days"
                    raise HttpStatusError(message, 400, shown) from None
                except requests.HTTPError as exc:
                    reasons.append(_reason(exc.response.text) if exc.response is not None else "")
                    raise
                finally:
                    entsoe_api.URL = previous

        try:
            return self.client.call(send, shown=shown, feed=self.name)
        except HttpStatusError as exc:
            if isinstance(exc, RateLimitedError) or not 400 <= exc.status < 500 or not reasons:
                raise
            hint = " (check the security token)" if exc.status in (401, 403) else ""
            raise HttpStatusError(
                f"{self.name}: GET {shown} failed with HTTP {exc.status}{hint}: {redact(reasons[-1])[:300]!r}",
                exc.status,
                shown,
            ) from None

    def document(self, code: str, start: pd.Timestamp, end: pd.Timestamp) -> str | None:
        """The A75 GL_MarketDocument of zone `code` over [start, end), from the cache when fresh; None if no data."""
        try:
            area = lookup_area(code)
        except ValueError:
            raise ValueError(f"{self.name}: {code!r} is not an ENTSO-E area (see entsoe.mappings.Area)") from None
        params = [
            ("documentType", DOCUMENT_TYPE),
            ("processType", "A16"),
            ("in_Domain", area.code),
            ("periodStart", start.strftime("%Y%m%d%H00")),
            ("periodEnd", end.strftime("%Y%m%d%H00")),
        ]
        endpoint = self._endpoint()
        shown = redact_url(endpoint, params)
        key = cache_key("GET", endpoint, params)
        hit, body = self.client.cache.get(key, self.settings.cache_ttl_s)
        if hit and isinstance(body, str):
            return body
        text = self._request(area, start, end, shown)
        if text is None or _check(text, shown) is None:
            return None
        self.client.cache.put(key, text, shown)
        return text

    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = FeedData(self.name, region, start, end)
        span = pd.Timedelta(days=float(self.settings.option("max_range_days", 7)))
        # the hours before `start` only show which production types report and how often (partial_mix, partial_hour)
        context = pd.Timedelta(hours=float(self.settings.option("context_hours", 24)))
        columns: dict[str, list[pd.Series]] = {}
        steps: dict[str, pd.Timedelta] = {}
        for window_start, window_end in chunks(start - context, end, span):
            text = self.document(code, window_start, window_end)
            if text is None:
                log.info(
                    "%s: no matching data for %s in [%s, %s)", self.name, code, iso_z(window_start), iso_z(window_end)
                )
                continue
            series, resolutions = self._series(data, code, text)
            for psr, values in series.items():
                columns.setdefault(psr, []).append(values)
                steps[psr] = min(steps.get(psr, HOUR), resolutions.get(psr, HOUR))
        hourly = []
        for psr, parts in columns.items():
            points = pd.concat(parts).sort_index()
            points = points[~points.index.duplicated(keep="last")].dropna()
            if points.empty:
                continue
            expected = max(1, int(HOUR / steps[psr]))
            grouped = points.groupby(points.index.floor("h")).agg(["mean", "size"])
            hourly.append(
                pd.DataFrame(
                    {
                        "hour_utc": grouped.index,
                        "psr": psr,
                        "fuel": PSR_FUELS[psr],
                        "mw": grouped["mean"].to_numpy(),
                        "partial": (grouped["size"] < expected).to_numpy(),
                    }
                )
            )
        if not hourly:
            data.frames[GENERATION] = frame(GENERATION, [])
            data.frames[CARBON_INTENSITY] = frame(CARBON_INTENSITY, [])
            return data
        rows = pd.concat(hourly, ignore_index=True)
        types = rows["psr"].nunique()
        rows = rows[(rows["hour_utc"] >= start) & (rows["hour_utc"] < end)]
        if rows.empty:
            data.frames[GENERATION] = frame(GENERATION, [])
            data.frames[CARBON_INTENSITY] = frame(CARBON_INTENSITY, [])
            return data
        generation = rows.groupby(["hour_utc", "fuel"], as_index=False).agg(
            generation_mw=("mw", "sum"), partial=("partial", "any")
        )
        generation["quality_flag"] = generation["partial"].map({True: "partial_hour", False: None})
        generation["region"], generation["data_source"] = region, self.name
        data.frames[GENERATION] = within(frame(GENERATION, generation), start, end)
        data.frames[CARBON_INTENSITY] = within(self._intensity(region, rows, types), start, end)
        return data

    def _series(self, data: FeedData, code: str, text: str) -> tuple[dict[str, pd.Series], dict[str, pd.Timedelta]]:
        """The generation series (MW, UTC index) of one document by psr type, storage and consumption left out,
        and each type's finest resolution."""
        try:
            with warnings.catch_warnings():  # entsoe-py parses XML with bs4's HTML parser, on purpose
                warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
                parsed = parse_generation(text, nett=False)
        except (ValueError, KeyError, AttributeError, TypeError, NotImplementedError) as exc:
            raise self.payload_error(f"GL_MarketDocument could not be parsed ({type(exc).__name__}: {exc})") from None
        resolutions = _resolutions(text)
        if not resolutions:
            return {}, {}  # consumption series only (parse_generation then drops the direction level)
        if isinstance(parsed, pd.Series):
            parsed = parsed.to_frame()
        if isinstance(parsed.columns, pd.MultiIndex):
            # (production type, direction): keep what the zone generates, not what its units consume
            parsed = parsed.xs("Actual Aggregated", axis=1, level=-1)
        out: dict[str, pd.Series] = {}
        for number, name in enumerate(parsed.columns, start=1):
            psr = PSR_BY_NAME.get(str(name))
            if psr in STORAGE_PSR:
                continue
            if psr not in PSR_FUELS:
                data.add_rejection(
                    GENERATION,
                    Rejection("production type without a fuel mapping", f"entsoe:{code}", number, "psrType", str(name)),
                )
                continue
            series = pd.to_numeric(parsed[name], errors="coerce")
            series.index = pd.DatetimeIndex(series.index).tz_convert("UTC")
            out[psr] = series
        return out, resolutions

    def _intensity(self, region: str, rows: pd.DataFrame, types: int) -> pd.DataFrame:
        mix = rows.pivot_table(index="hour_utc", columns="fuel", values="mw", aggfunc="sum").fillna(0.0).clip(lower=0.0)
        ci = intensity_from_mix(mix, CARBONCAST_DIRECT).dropna()
        reported = rows.groupby("hour_utc")["psr"].nunique()
        partial = rows.groupby("hour_utc")["partial"].any()
        out = ci.rename("carbon_intensity_gco2_per_kwh").rename_axis("hour_utc").reset_index()
        out["quality_flag"] = [
            join_flags(
                "recomputed_from_mix",
                "partial_hour" if partial.get(hour, False) else None,
                "partial_mix" if reported.get(hour, 0) < types else None,
            )
            for hour in out["hour_utc"]
        ]
        out["region"], out["data_source"] = region, self.name
        out["signal_type"], out["basis"], out["scope"] = "average", "production", "direct"
        return frame(CARBON_INTENSITY, out)


def _resolutions(text: str) -> dict[str, pd.Timedelta]:
    """psr type → the finest `resolution` (ISO 8601 duration) of its generation series in the document."""
    out: dict[str, pd.Timedelta] = {}
    for series in ET.fromstring(text):
        if _local(series.tag) != "TimeSeries" or _child_text(series, "inBiddingZone_Domain.mRID") is None:
            continue
        psr = _child_text(series, "psrType") or ""
        for element in series.iter():
            if _local(element.tag) == "resolution":
                try:
                    step = pd.Timedelta(element.text.strip())
                except (AttributeError, ValueError):
                    raise PayloadError(
                        f"entsoe: psrType {psr}: resolution {element.text!r} is not a duration"
                    ) from None
                out[psr] = min(out.get(psr, step), step)
    return out


def _reason(text: str) -> str:
    """The `Reason/text` of an acknowledgement document, else the body itself."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return text
    return _child_text(root, "text") or text


def _check(text: str, shown: str) -> str | None:
    """`text` if it is a well-formed A75 GL_MarketDocument in MW; None for a "No matching data" acknowledgement."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise PayloadError(
            f"entsoe: GET {shown} returned XML that does not parse ({exc}): {redact(text)[:200]!r}"
        ) from None
    kind = _local(root.tag)
    if kind == "Acknowledgement_MarketDocument":
        reason = _child_text(root, "text") or ""
        if NO_DATA.lower() in reason.lower():
            return None
        raise PayloadError(f"entsoe: GET {shown} returned an acknowledgement instead of data: {reason[:300]!r}")
    if kind != "GL_MarketDocument":
        raise PayloadError(f"entsoe: GET {shown} returned a {kind}, not a GL_MarketDocument")
    document_type = next((c.text for c in root if _local(c.tag) == "type"), None)
    if document_type not in (None, DOCUMENT_TYPE):
        raise PayloadError(f"entsoe: GET {shown}: document type {document_type!r} is not {DOCUMENT_TYPE}")
    for number, series in enumerate((c for c in root if _local(c.tag) == "TimeSeries"), start=1):
        unit = _child_text(series, "quantity_Measure_Unit.name")
        if unit != UNIT:
            psr = _child_text(series, "psrType")
            raise PayloadError(
                f"entsoe: GET {shown}: TimeSeries {number} (psrType {psr}) has quantity_Measure_Unit.name "
                f"{unit!r}, expected {UNIT!r} (MW)"
            )
    return text
