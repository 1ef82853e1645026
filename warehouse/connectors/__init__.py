"""Live grid connectors: Electricity Maps, WattTime, UK Carbon Intensity, EIA-930, ENTSO-E.

Each connector turns its API's payloads into the warehouse's long grid tables (docs/data-contracts.md), with the
feed name in `data_source` and `signal_type`/`basis`/`scope` on every value:

=================  ====================================================================  ========================
feed               tables                                                                signal
=================  ====================================================================  ========================
electricitymaps    raw.grid_carbon_intensity, raw.grid_generation (production breakdown)  average, consumption,
                                                                                          lifecycle (or direct)
watttime           raw.grid_carbon_intensity (history), raw.grid_live_forecasts           marginal, production,
                                                                                          direct
ukci               raw.grid_carbon_intensity, raw.grid_generation_share (percent)         average, consumption,
                                                                                          direct
eia930             raw.grid_generation, raw.grid_carbon_intensity (derived from the mix)  average, production,
                                                                                          direct + lifecycle
entsoe             raw.grid_generation (A75 per production type, 15/30/60-min → hourly    average, production,
                   mean), raw.grid_carbon_intensity (derived from the mix; entsoe-py)     direct
=================  ====================================================================  ========================

Entry points: `fetch_region`, `live_batches` (Batches for `warehouse.db.load_batch`), `ingest_live` (fetch + load),
and `python -m warehouse.connectors`. Feeds and regions are configured in `feeds.yaml`; HTTP behaviour, caching
and credentials live in `warehouse.connectors.http` (WattTime's requests go through the official `watttime` SDK
under that same policy).
"""

from warehouse.connectors.base import Connector, FeedSettings
from warehouse.connectors.feeds import (
    CONNECTORS,
    EmptyFeedError,
    FeedConfig,
    FeedFailure,
    FeedUnavailable,
    LiveFeeds,
    RegionFeeds,
    RegionFetch,
    batch_id,
    fetch_region,
    live_batches,
    load_feed_config,
    parse_feed_config,
)
from warehouse.connectors.http import (
    ConnectorError,
    HttpClient,
    HttpSettings,
    HttpStatusError,
    MissingCredentialError,
    PayloadError,
    RateLimitedError,
    TransportError,
    get_credentials,
)
from warehouse.connectors.ingest import LiveIngestError, LiveIngestReport, ingest_live
from warehouse.connectors.schema import (
    CARBON_INTENSITY,
    COLUMNS,
    GENERATION,
    GENERATION_SHARE,
    LIVE_FORECASTS,
    FeedData,
)

__all__ = [
    "CARBON_INTENSITY",
    "COLUMNS",
    "CONNECTORS",
    "Connector",
    "ConnectorError",
    "EmptyFeedError",
    "FeedConfig",
    "FeedData",
    "FeedFailure",
    "FeedSettings",
    "FeedUnavailable",
    "GENERATION",
    "GENERATION_SHARE",
    "HttpClient",
    "HttpSettings",
    "HttpStatusError",
    "LIVE_FORECASTS",
    "LiveFeeds",
    "LiveIngestError",
    "LiveIngestReport",
    "MissingCredentialError",
    "PayloadError",
    "RateLimitedError",
    "RegionFeeds",
    "RegionFetch",
    "TransportError",
    "batch_id",
    "fetch_region",
    "get_credentials",
    "ingest_live",
    "live_batches",
    "load_feed_config",
    "parse_feed_config",
]
