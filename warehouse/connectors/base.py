"""The connector interface: a feed's settings, its HTTP access and its credentials."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from warehouse.connectors.http import ConnectorError, HttpClient, PayloadError, get_credentials
from warehouse.connectors.schema import FeedData


@dataclass(frozen=True)
class FeedSettings:
    """One feed's configuration (from feeds.yaml): where it lives and its feed-specific options."""

    name: str
    base_url: str
    options: Mapping[str, Any] = field(default_factory=dict)
    conn_id: str | None = None  # Airflow connection id overriding the default of warehouse.connectors.http
    cache_ttl_s: float | None = None  # overrides the client's TTL for this feed

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


class Connector(ABC):
    """Base of the feed connectors. `fetch` returns the rows of one region and interval as FeedData."""

    name: ClassVar[str] = ""
    needs_credentials: ClassVar[bool] = True

    def __init__(self, client: HttpClient, settings: FeedSettings, credentials: Mapping[str, str] | None = None):
        self.client = client
        self.settings = settings
        self._credentials = dict(credentials) if credentials else None

    def credentials(self) -> dict[str, str]:
        if self._credentials is None:
            self._credentials = get_credentials(self.name, conn_id=self.settings.conn_id)
        return self._credentials

    def url(self, path: str) -> str:
        return self.settings.base_url.rstrip("/") + "/" + path.lstrip("/")

    def get(self, path: str, *, params=None, headers=None, use_cache: bool = True, cache_ttl_s=None) -> Any:
        ttl = cache_ttl_s if cache_ttl_s is not None else self.settings.cache_ttl_s
        return self.client.get_json(
            self.url(path),
            params=params,
            headers=headers,
            use_cache=use_cache,
            cache_ttl_s=ttl,
            feed=self.name,
        )

    def payload_error(self, message: str) -> PayloadError:
        return PayloadError(f"{self.name}: unexpected response: {message}")

    @abstractmethod
    def fetch(self, region: str, code: str, start: pd.Timestamp, end: pd.Timestamp) -> FeedData:
        """Hourly carbon intensity and/or generation of `region` (the feed's zone `code`) over [start, end)."""

    def forecast(self, region: str, code: str, as_of: pd.Timestamp) -> FeedData:
        """The feed's own forecast issued at `as_of`; only some feeds publish one (WattTime)."""
        raise ConnectorError(f"the {self.name} feed publishes no forecast; choose a feed that does (WattTime)")
