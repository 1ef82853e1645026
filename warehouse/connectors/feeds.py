"""Feed configuration, primary/fallback per region, and the batches that load live data idempotently.

`feeds.yaml` (beside this file; `LIVE_FEEDS_CONFIG` replaces it) names each feed's base URL and options and gives
every region a `primary` feed and an optional `fallback`, plus `extras` (fetched too, on their own) and
`forecasts` (feeds whose own CI forecast is stored). `<FEED>_BASE_URL` overrides a base URL (tests point them
at 127.0.0.1).

`fetch_region(region, start, end)` asks the primary; when it raises (after the HTTP client's retries) or returns
no carbon-intensity row for the interval, the fallback serves. Rows keep `data_source` = the feed that served them;
fallback rows also carry `fallback_from=<primary>` in `quality_flag`. Both failing raises FeedUnavailable with
both (redacted) reasons.

`live_batches(regions, start, end)` turns the results into `Batch`es for `warehouse.db.load_batch`, one per table
with `batch_id = "<feed>:<region>:<start>/<end>"` (forecasts: `"<feed>:<region>:forecast@<as_of>"`), so loading the
same interval again replaces exactly its own rows. When the primary serves, an empty batch with the fallback's
id for the same interval is emitted too (`supersede`), so fallback rows from an earlier failed run are removed.
The interval is always given; nothing here reads the wall clock (the forecast `as_of` is the interval end).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from common.registry import Registry
from common.timeutil import iso_z
from common.timeutil import utc as to_utc
from warehouse.connectors.base import Connector, FeedSettings
from warehouse.connectors.eia930 import EIA930Connector
from warehouse.connectors.electricitymaps import ElectricityMapsConnector
from warehouse.connectors.entsoe import EntsoeConnector
from warehouse.connectors.http import ConnectorError, HttpClient, HttpSettings, redact
from warehouse.connectors.schema import (
    CARBON_INTENSITY,
    GENERATION,
    GENERATION_SHARE,
    LIVE_FORECASTS,
    FeedData,
    frame,
    normalize_interval,
)
from warehouse.connectors.ukci import UKCarbonIntensityConnector
from warehouse.connectors.watttime import WattTimeConnector
from warehouse.db import Batch

log = logging.getLogger("warehouse.connectors")

DEFAULT_CONFIG_PATH = Path(__file__).with_name("feeds.yaml")
CONNECTORS = Registry("connector")
CONNECTORS.register("electricitymaps", ElectricityMapsConnector)
CONNECTORS.register("watttime", WattTimeConnector)
CONNECTORS.register("ukci", UKCarbonIntensityConnector)
CONNECTORS.register("eia930", EIA930Connector)
CONNECTORS.register("entsoe", EntsoeConnector)
# the tables each feed's `fetch` writes (used to supersede a fallback's batch when the primary serves)
FEED_TABLES: dict[str, tuple[str, ...]] = {
    "electricitymaps": (CARBON_INTENSITY, GENERATION),
    "watttime": (CARBON_INTENSITY,),
    "ukci": (CARBON_INTENSITY, GENERATION_SHARE),
    "eia930": (CARBON_INTENSITY, GENERATION),
    "entsoe": (CARBON_INTENSITY, GENERATION),
}


class FeedUnavailable(ConnectorError):
    """Neither the primary nor the fallback could serve a region."""

    def __init__(self, region: str, errors: Mapping[str, str]):
        self.region, self.errors = region, dict(errors)
        detail = "; ".join(f"{feed}: {message}" for feed, message in errors.items())
        super().__init__(f"no live feed could serve region {region}: {detail}")


@dataclass(frozen=True)
class FeedFailure:
    """A feed that could not serve: kind `region` (primary and fallback failed), `extra` or `forecast`."""

    region: str
    kind: str
    feed: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.feed} for {self.region}: {self.message}"


class EmptyFeedError(ConnectorError):
    """A feed answered but had no carbon-intensity row for the interval."""


@dataclass(frozen=True)
class RegionFeeds:
    region: str
    primary: str
    fallback: str | None = None
    extras: tuple[str, ...] = ()
    forecasts: tuple[str, ...] = ()
    codes: Mapping[str, str] = field(default_factory=dict)

    def code(self, feed: str) -> str:
        return self.codes.get(feed, self.region)


@dataclass(frozen=True)
class FeedConfig:
    http: HttpSettings
    feeds: Mapping[str, FeedSettings]
    regions: Mapping[str, RegionFeeds]

    def with_base_urls(self, urls: Mapping[str, str]) -> FeedConfig:
        feeds = dict(self.feeds)
        for name, url in urls.items():
            feeds[name] = dataclasses.replace(self.feeds[name], base_url=url)
        return dataclasses.replace(self, feeds=feeds)

    def with_http(self, **settings: Any) -> FeedConfig:
        return dataclasses.replace(self, http=dataclasses.replace(self.http, **settings))

    def with_options(self, feed: str, **options: Any) -> FeedConfig:
        feeds = dict(self.feeds)
        feeds[feed] = dataclasses.replace(self.feeds[feed], options={**self.feeds[feed].options, **options})
        return dataclasses.replace(self, feeds=feeds)

    def region(self, name: str) -> RegionFeeds:
        if name not in self.regions:
            raise KeyError(f"region {name!r} has no live feed configured; known: {sorted(self.regions)}")
        return self.regions[name]


def parse_feed_config(
    raw: Mapping[str, Any], *, origin: str = "<dict>", env: Mapping[str, str] | None = None
) -> FeedConfig:
    """Validate a config mapping (the YAML's shape). `env` (default os.environ) supplies <FEED>_BASE_URL."""
    env = os.environ if env is None else env
    if not isinstance(raw, Mapping):
        raise ValueError(f"{origin}: expected a mapping at the top level")
    unknown = set(raw) - {"http", "feeds", "regions"}
    if unknown:
        raise ValueError(f"{origin}: unknown top-level keys {sorted(unknown)}")
    http = HttpSettings.from_mapping(raw.get("http"))
    feeds: dict[str, FeedSettings] = {}
    for name, spec in (raw.get("feeds") or {}).items():
        if name not in CONNECTORS:
            raise ValueError(f"{origin}: feed {name!r} has no connector; known: {sorted(CONNECTORS.names)}")
        spec = dict(spec or {})
        base_url = env.get(f"{name.upper()}_BASE_URL") or spec.pop("base_url", None)
        spec.pop("base_url", None)
        if not base_url:
            raise ValueError(f"{origin}: feed {name!r} has no base_url")
        conn_id = spec.pop("conn_id", None)
        ttl = spec.pop("cache_ttl_s", None)
        feeds[name] = FeedSettings(name, str(base_url), spec, conn_id, None if ttl is None else float(ttl))
    regions: dict[str, RegionFeeds] = {}
    for name, spec in (raw.get("regions") or {}).items():
        spec = dict(spec or {})
        unknown = set(spec) - {"primary", "fallback", "extras", "forecasts", "codes"}
        if unknown:
            raise ValueError(f"{origin}: region {name!r}: unknown keys {sorted(unknown)}")
        if not spec.get("primary"):
            raise ValueError(f"{origin}: region {name!r} has no primary feed")
        region = RegionFeeds(
            region=str(name),
            primary=spec["primary"],
            fallback=spec.get("fallback"),
            extras=tuple(spec.get("extras") or ()),
            forecasts=tuple(spec.get("forecasts") or ()),
            codes={str(k): str(v) for k, v in (spec.get("codes") or {}).items()},
        )
        used = [region.primary, *([region.fallback] if region.fallback else []), *region.extras, *region.forecasts]
        missing = [feed for feed in used if feed not in feeds]
        if missing:
            raise ValueError(f"{origin}: region {name!r} uses feeds {missing} that are not configured under feeds:")
        if region.fallback == region.primary:
            raise ValueError(f"{origin}: region {name!r}: fallback is the primary feed")
        clash = set(region.extras) & {region.primary, region.fallback}
        if clash:
            raise ValueError(f"{origin}: region {name!r}: extras {sorted(clash)} are already its primary/fallback")
        regions[region.region] = region
    return FeedConfig(http, feeds, regions)


def load_feed_config(path: Path | str | None = None) -> FeedConfig:
    """feeds.yaml (or LIVE_FEEDS_CONFIG, or `path`), validated, with <FEED>_BASE_URL overrides applied."""
    path = Path(path or os.environ.get("LIVE_FEEDS_CONFIG") or DEFAULT_CONFIG_PATH)
    if not path.exists():
        raise FileNotFoundError(f"live feed config {path} does not exist")
    with open(path) as handle:
        raw = yaml.safe_load(handle) or {}
    return parse_feed_config(raw, origin=str(path))


@dataclass
class RegionFetch:
    """The rows for one region and interval, and which feed served them."""

    region: str
    start: pd.Timestamp
    end: pd.Timestamp
    primary: str
    served_by: str
    data: FeedData
    errors: dict[str, str] = field(default_factory=dict)  # feed -> redacted reason it failed

    @property
    def fallback_used(self) -> bool:
        return self.served_by != self.primary


class LiveFeeds:
    """The feeds of one configuration sharing one HTTP client (and WattTime's login token)."""

    def __init__(
        self,
        config: FeedConfig | None = None,
        client: HttpClient | None = None,
        credentials: Mapping[str, Mapping[str, str]] | None = None,
    ):
        self.config = config or load_feed_config()
        self.client = client or HttpClient(self.config.http)
        self._credentials = dict(credentials or {})
        self._connectors: dict[str, Connector] = {}

    def connector(self, feed: str) -> Connector:
        if feed not in self._connectors:
            if feed not in self.config.feeds:
                raise KeyError(f"feed {feed!r} is not configured; known: {sorted(self.config.feeds)}")
            cls = CONNECTORS.factory(feed)
            self._connectors[feed] = cls(self.client, self.config.feeds[feed], self._credentials.get(feed))
        return self._connectors[feed]

    def _fetch(self, feed: str, region: RegionFeeds, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        data = self.connector(feed).fetch(region.region, region.code(feed), start, end)
        if CARBON_INTENSITY in FEED_TABLES[feed] and data.rows(CARBON_INTENSITY) == 0:
            raise EmptyFeedError(
                f"{feed}: no carbon-intensity rows for {region.region} in [{iso_z(start)}, {iso_z(end)})"
            )
        return data

    def fetch_region(self, region: str, start, end) -> RegionFetch:
        spec = self.config.region(region)
        start, end = normalize_interval(start, end)
        errors: dict[str, str] = {}
        for feed in [spec.primary, *([spec.fallback] if spec.fallback else [])]:
            try:
                data = self._fetch(feed, spec, start, end)
            except Exception as exc:  # any failure of a feed hands over to the next one
                expected = isinstance(exc, (ConnectorError, ValueError))
                errors[feed] = redact(exc) if expected else f"{type(exc).__name__}: {redact(exc)}"
                log.warning(
                    "live feed %s failed for %s [%s, %s): %s",
                    feed,
                    region,
                    iso_z(start),
                    iso_z(end),
                    errors[feed],
                    exc_info=not expected,  # an unexpected error is a bug: keep its traceback in the log
                )
                continue
            if feed != spec.primary:
                data = data.flagged(f"fallback_from={spec.primary}")
                log.warning("region %s served by fallback %s (primary %s failed)", region, feed, spec.primary)
            return RegionFetch(region, start, end, spec.primary, feed, data, errors)
        raise FeedUnavailable(region, errors)

    def fetch_forecast(self, region: str, feed: str, as_of) -> FeedData:
        spec = self.config.region(region)
        return self.connector(feed).forecast(region, spec.code(feed), to_utc(as_of))

    def batches(
        self,
        regions: Iterable[str],
        start,
        end,
        *,
        extras: bool = True,
        forecasts: bool = True,
        supersede: bool = True,
        on_error: str = "raise",
        failures: list[FeedFailure] | None = None,
    ) -> list[Batch]:
        """Batches of every region over [start, end): primary or fallback, plus extras and forecasts.

        `on_error="raise"` raises FeedUnavailable when a region has no feed left; `"skip"` records it in
        `failures` and goes on. Extra and forecast feeds never raise: their failures are recorded (and logged).
        """
        if on_error not in ("raise", "skip"):
            raise ValueError("on_error must be 'raise' or 'skip'")
        start, end = normalize_interval(start, end)
        failures = failures if failures is not None else []
        out: list[Batch] = []
        for region in regions:
            spec = self.config.region(region)
            try:
                fetched = self.fetch_region(region, start, end)
            except FeedUnavailable as exc:
                if on_error == "raise":
                    raise
                failures.append(FeedFailure(region, "region", "+".join(exc.errors), redact(exc)))
                log.error("%s", redact(exc))
            else:
                out.extend(batches_for(fetched.data, start, end))
                if supersede and not fetched.fallback_used and spec.fallback:
                    out.extend(_empty_batches(spec.fallback, region, start, end))
            for feed in spec.extras if extras else ():
                try:
                    out.extend(batches_for(self.connector(feed).fetch(region, spec.code(feed), start, end), start, end))
                except (ConnectorError, ValueError) as exc:
                    failures.append(FeedFailure(region, "extra", feed, redact(exc)))
                    log.warning("extra feed %s failed for %s: %s", feed, region, redact(exc))
            for feed in spec.forecasts if forecasts else ():
                try:
                    data = self.fetch_forecast(region, feed, end)
                except (ConnectorError, ValueError) as exc:
                    failures.append(FeedFailure(region, "forecast", feed, redact(exc)))
                    log.warning("forecast feed %s failed for %s: %s", feed, region, redact(exc))
                    continue
                out.extend(batches_for(data, start, end, forecast_as_of=end))
        return out


def batch_id(feed: str, region: str, start: pd.Timestamp, end: pd.Timestamp) -> str:
    return f"{feed}:{region}:{iso_z(start)}/{iso_z(end)}"


def forecast_batch_id(feed: str, region: str, as_of: pd.Timestamp) -> str:
    return f"{feed}:{region}:forecast@{iso_z(as_of)}"


def batches_for(data: FeedData, start: pd.Timestamp, end: pd.Timestamp, *, forecast_as_of=None) -> list[Batch]:
    """One Batch per table of `data` (tables with only rejections included), keyed feed + region + interval."""
    tables = list(dict.fromkeys([*data.frames, *data.rejections]))
    out = []
    for table in tables:
        if table == LIVE_FORECASTS and forecast_as_of is not None:
            key = forecast_batch_id(data.feed, data.region, to_utc(forecast_as_of))
        else:
            key = batch_id(data.feed, data.region, start, end)
        rows = data.frames.get(table)
        out.append(
            Batch(
                table,
                key,
                data.feed,
                rows if rows is not None else frame(table, []),
                list(data.rejections.get(table, [])),
            )
        )
    return out


def _empty_batches(feed: str, region: str, start: pd.Timestamp, end: pd.Timestamp) -> list[Batch]:
    key = batch_id(feed, region, start, end)
    return [Batch(table, key, feed, frame(table, [])) for table in FEED_TABLES[feed]]


# -- module-level conveniences ----------------------------------------------------------------------------------
def fetch_region(
    region: str, start, end, *, config: FeedConfig | None = None, client: HttpClient | None = None
) -> RegionFetch:
    """Rows for `region` over [start, end) from its primary feed, or its fallback when the primary fails."""
    return LiveFeeds(config, client).fetch_region(region, start, end)


def live_batches(
    regions: Iterable[str],
    start,
    end,
    *,
    config: FeedConfig | None = None,
    client: HttpClient | None = None,
    **options: Any,
) -> list[Batch]:
    """Batches (for `load_batch`) of every region over [start, end); see LiveFeeds.batches for the options."""
    return LiveFeeds(config, client).batches(regions, start, end, **options)
