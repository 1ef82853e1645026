"""The shared HTTP client of the live grid connectors: timeouts, retries, rate limits, a disk cache, credentials.

* Timeouts: a (connect, read) pair on every request.
* Retries: connection errors, timeouts and 5xx are retried with exponential backoff (plus a little jitter);
  429 waits for the server's `Retry-After` (seconds or an HTTP date) and gives up at once when the server asks
  for longer than `retry_after_max_s`. Other 4xx fail at once (401/403 with a hint about the credentials).
* Cache: successful JSON responses are stored under `var/cache/http/` (`HTTP_CACHE_DIR` overrides), one file per
  request, named by a SHA-256 of method + URL + query parameters *without* the secret parameters, and expire
  after a TTL. The files hold the body plus the redacted URL; no secret is ever written.
* Credentials (`get_credentials`): environment variables first, then the Airflow Connection. Airflow is never
  required: it is consulted only inside an Airflow process (`airflow` already imported), when
  `AIRFLOW_CONN_<ID>` is set (parsed here, no Airflow import needed), or when `CONNECTORS_USE_AIRFLOW=1`;
  `CONNECTORS_USE_AIRFLOW=0` switches it off. A missing credential names the env var(s) and the connection id.
* Secrets are never logged: every message this module produces goes through `redact`, which replaces the known
  secret values and the values of secret query parameters; a logging filter does the same for urllib3's debug
  lines (which print request URLs, and EIA puts its key in the URL).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import requests

from warehouse.config import var_dir

log = logging.getLogger("warehouse.connectors")

# Query parameter / header names whose values are secrets: left out of cache keys, masked in messages.
SECRET_PARAM_NAMES = frozenset({"api_key", "apikey", "key", "token", "auth-token", "access_token", "password"})
REDACTED = "***"

Params = Mapping[str, Any] | Sequence[tuple[str, Any]] | None


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------
class ConnectorError(RuntimeError):
    """Any failure of a live feed (after retries). Messages are redacted."""


class MissingCredentialError(ConnectorError):
    """A feed's key/login is not configured; the message names the env var(s) and the Airflow connection id."""


class HttpStatusError(ConnectorError):
    def __init__(self, message: str, status: int, url: str):
        super().__init__(message)
        self.status, self.url = status, url


class RateLimitedError(HttpStatusError):
    """429 that did not clear within the retry budget (or asked for a longer wait than allowed)."""


class TransportError(ConnectorError):
    """Connection refused/reset or timeout, after the retries."""


class PayloadError(ConnectorError):
    """A response whose JSON does not have the documented shape (names the feed and the field)."""


# ----------------------------------------------------------------------------------------------------------------
# Redaction
# ----------------------------------------------------------------------------------------------------------------
_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()
_SECRET_QUERY_RE = re.compile(
    r"(?P<name>(?:" + "|".join(re.escape(n) for n in sorted(SECRET_PARAM_NAMES)) + r"))=(?P<value>[^&\s'\"#]+)",
    re.IGNORECASE,
)


def register_secret(value: str | None) -> None:
    """Remember a secret value so that `redact` masks it wherever it appears (messages, logs)."""
    if value and len(value) >= 4:
        with _SECRETS_LOCK:
            _SECRETS.add(value)
        _install_log_filter()


def redact(text: Any) -> str:
    """`text` as a string with every registered secret and every secret query parameter value masked."""
    out = str(text)
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        if secret in out:
            out = out.replace(secret, REDACTED)
        quoted = quote(secret, safe="")
        if quoted != secret and quoted in out:
            out = out.replace(quoted, REDACTED)
    return _SECRET_QUERY_RE.sub(lambda m: f"{m.group('name')}={REDACTED}", out)


def redact_url(url: str, params: Params = None) -> str:
    """The full URL (with `params` encoded) with secret parameter values masked."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)] + _param_items(params)
    masked = [(k, REDACTED if k.lower() in SECRET_PARAM_NAMES else str(v)) for k, v in query]
    return redact(urlunsplit(parts._replace(query=urlencode(masked, safe="[]*:"))))


class _RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken record is not ours to fix
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_FILTER = _RedactingFilter()
_FILTERED_LOGGERS = (
    "urllib3",
    "urllib3.connectionpool",
    "urllib3.poolmanager",
    "urllib3.util.retry",
    "requests",
    "warehouse.connectors",
)


def _install_log_filter() -> None:
    for name in _FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


_install_log_filter()


# ----------------------------------------------------------------------------------------------------------------
# Credentials
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CredentialSpec:
    """Where a feed's credentials come from: env vars (one per field) or an Airflow connection."""

    feed: str
    fields: tuple[str, ...]  # api_key | username, password
    env_vars: tuple[str, ...]  # same order as fields
    conn_id: str

    def describe(self) -> str:
        env = " and ".join(self.env_vars)
        return f"set {env} in the environment, or create the Airflow connection {self.conn_id!r}"


CREDENTIALS: dict[str, CredentialSpec] = {
    "electricitymaps": CredentialSpec(
        "electricitymaps", ("api_key",), ("ELECTRICITYMAPS_API_KEY",), "electricitymaps_default"
    ),
    "watttime": CredentialSpec(
        "watttime", ("username", "password"), ("WATTTIME_USERNAME", "WATTTIME_PASSWORD"), "watttime_default"
    ),
    "eia930": CredentialSpec("eia930", ("api_key",), ("EIA_API_KEY",), "eia_default"),
    "entsoe": CredentialSpec("entsoe", ("api_key",), ("ENTSOE_API_KEY",), "entsoe_default"),
}


def _conn_fields(spec: CredentialSpec, login: str | None, password: str | None, extra: Mapping | None) -> dict:
    extra = dict(extra or {})
    if spec.fields == ("api_key",):
        key = password or extra.get("api_key") or extra.get("token") or extra.get("auth-token")
        return {"api_key": key} if key else {}
    values = {"username": login or extra.get("username"), "password": password or extra.get("password")}
    return values if all(values.values()) else {}


def _parse_airflow_conn_env(raw: str) -> tuple[str | None, str | None, dict]:
    """An `AIRFLOW_CONN_*` value: JSON (`{"login":..,"password":..,"extra":{..}}`) or URI form."""
    raw = raw.strip()
    if raw.startswith("{"):
        data = json.loads(raw)
        extra = data.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra) if extra.strip() else {}
        return data.get("login"), data.get("password"), extra
    parts = urlsplit(raw)
    extra = dict(parse_qsl(parts.query))
    if "__extra__" in extra:
        extra = json.loads(extra.pop("__extra__"))
    login = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return login, password, extra


def _airflow_connection(conn_id: str) -> tuple[str | None, str | None, dict] | None:
    mode = os.environ.get("CONNECTORS_USE_AIRFLOW", "auto").strip().lower()
    if mode in {"0", "false", "no", "off"}:
        return None
    env_value = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if env_value:
        try:
            return _parse_airflow_conn_env(env_value)
        except Exception as exc:  # malformed: say so, without the value
            log.warning("AIRFLOW_CONN_%s is not a valid connection (%s)", conn_id.upper(), type(exc).__name__)
            return None
    if mode not in {"1", "true", "yes", "on"} and "airflow" not in sys.modules:
        return None  # not inside Airflow: do not pay for (or depend on) importing it
    try:
        try:
            from airflow.sdk import BaseHook  # noqa: PLC0415 - Airflow is only there inside a task

            conn = BaseHook.get_connection(conn_id)
        except ImportError:
            from airflow.hooks.base import BaseHook as LegacyHook  # noqa: PLC0415 - Airflow 2

            conn = LegacyHook.get_connection(conn_id)
    except Exception as exc:  # not found, no metastore, not in a task: treat as absent
        log.debug("Airflow connection %r not available: %s", conn_id, redact(type(exc).__name__))
        return None
    extra = conn.extra_dejson if hasattr(conn, "extra_dejson") else {}
    return conn.login, conn.password, extra


def get_credentials(feed: str, *, conn_id: str | None = None) -> dict[str, str]:
    """The credentials of `feed` (`api_key`, or `username`+`password`), registered for redaction.

    Raises MissingCredentialError naming the env var(s) and the Airflow connection id to set.
    """
    if feed not in CREDENTIALS:
        raise KeyError(f"feed {feed!r} needs no credentials (known: {sorted(CREDENTIALS)})")
    spec = CREDENTIALS[feed]
    if conn_id:
        spec = CredentialSpec(spec.feed, spec.fields, spec.env_vars, conn_id)
    values = {f: os.environ.get(env, "").strip() for f, env in zip(spec.fields, spec.env_vars)}
    if not all(values.values()):
        found = _airflow_connection(spec.conn_id)
        values = _conn_fields(spec, *found) if found else {}
    if not values or not all(values.get(f) for f in spec.fields):
        raise MissingCredentialError(f"no credentials for the {feed} feed: {spec.describe()}")
    for name, value in values.items():
        if name != "username":
            register_secret(value)
    return values


# ----------------------------------------------------------------------------------------------------------------
# Settings and cache
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HttpSettings:
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 5  # total tries, the first included
    backoff_base_s: float = 1.0  # 1, 2, 4, ... (+ up to 10 % jitter)
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 300.0  # a 429 asking for longer than this fails at once
    cache_ttl_s: float = 3600.0
    cache_dir: str | None = None  # default: HTTP_CACHE_DIR or var/cache/http
    user_agent: str = "carbon-aware-planner/1 (+warehouse.connectors)"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> HttpSettings:
        values = dict(values or {})
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown http settings {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**values)


def default_cache_dir() -> Path:
    raw = os.environ.get("HTTP_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()

    return var_dir() / "cache" / "http"


def _param_items(params: Params) -> list[tuple[str, Any]]:
    if params is None:
        return []
    items = params.items() if isinstance(params, Mapping) else params
    out: list[tuple[str, Any]] = []
    for key, value in items:
        if isinstance(value, (list, tuple)):
            out.extend((key, v) for v in value)
        elif value is not None:
            out.append((key, value))
    return out


def cache_key(method: str, url: str, params: Params = None) -> str:
    """SHA-256 of method + URL + the non-secret query parameters (order-independent)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, str(v)) for k, v in _param_items(params)]
    kept = sorted((k, str(v)) for k, v in query if k.lower() not in SECRET_PARAM_NAMES)
    base = urlunsplit(parts._replace(query="", fragment=""))
    return hashlib.sha256(json.dumps([method.upper(), base, kept]).encode()).hexdigest()


class ResponseCache:
    """JSON bodies on disk, one file per request key, expiring after a TTL. Writes are atomic."""

    def __init__(self, directory: Path | str, ttl_s: float, clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.ttl_s = ttl_s
        self.clock = clock

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str, ttl_s: float | None = None) -> tuple[bool, Any]:
        path = self.path(key)
        try:
            entry = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError, OSError):
            return False, None
        ttl = self.ttl_s if ttl_s is None else ttl_s
        if ttl <= 0 or self.clock() - float(entry.get("fetched_at", 0)) > ttl:
            return False, None
        return True, entry.get("body")

    def put(self, key: str, body: Any, url: str) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"url": url, "fetched_at": self.clock(), "body": body}))
        os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------
# The client
# ----------------------------------------------------------------------------------------------------------------
def _retry_after_seconds(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - now())


@dataclass
class HttpClient:
    """requests.Session with timeouts, retries/backoff, 429 handling and the response cache."""

    settings: HttpSettings = field(default_factory=HttpSettings)
    cache_dir: Path | str | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time
    session: requests.Session | None = None

    def __post_init__(self) -> None:
        directory = self.cache_dir or self.settings.cache_dir or default_cache_dir()
        self.cache = ResponseCache(directory, self.settings.cache_ttl_s, self.clock)
        if self.session is None:
            self.session = requests.Session()
        self.session.headers.setdefault("User-Agent", self.settings.user_agent)
        self.session.headers["Accept"] = "application/json"

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _backoff(self, attempt: int) -> float:
        base = self.settings.backoff_base_s * (2 ** (attempt - 1))
        delay = min(self.settings.backoff_max_s, base)
        return delay + random.uniform(0, delay * 0.1)

    def get_json(
        self,
        url: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        use_cache: bool = True,
        cache_ttl_s: float | None = None,
        feed: str = "http",
    ) -> Any:
        """GET `url` and return its JSON body (from the cache when fresh). Raises ConnectorError subclasses."""
        shown = redact_url(url, params)
        settings = self.settings

        def send() -> Any:
            response = self.session.get(
                url,
                params=_param_items(params),
                headers=dict(headers or {}),
                timeout=(settings.connect_timeout_s, settings.read_timeout_s),
            )
            if response.status_code >= 400:
                raise requests.HTTPError(response=response)
            try:
                return response.json()
            except ValueError:
                raise PayloadError(
                    f"{feed}: GET {shown} returned HTTP {response.status_code} with a body that is not JSON: "
                    f"{redact(response.text)[:200]!r}"
                ) from None

        if not use_cache:
            return self.call(send, shown=shown, feed=feed)
        return self.cached(url, params, lambda: self.call(send, shown=shown, feed=feed), cache_ttl_s, feed)

    def cached(self, url: str, params: Params, fetch: Callable[[], Any], cache_ttl_s=None, feed: str = "http") -> Any:
        """The JSON body of GET `url` + `params`: from the cache when fresh, else `fetch()`'s (then stored)."""
        key, shown = cache_key("GET", url, params), redact_url(url, params)
        hit, body = self.cache.get(key, cache_ttl_s)
        if hit:
            log.debug("%s: cache hit %s", feed, shown)
            return body
        body = fetch()
        self.cache.put(key, body, shown)
        return body

    def call(self, send: Callable[[], Any], *, shown: str, feed: str) -> Any:
        """`send()` under the retry policy; `send` returns a body or raises requests' errors (HTTPError with its
        response for a status >= 400). The policy is the module's: 5xx, timeouts and connection errors back off,
        429 waits for Retry-After, other 4xx fail at once; every failure surfaces as a ConnectorError subclass."""
        settings = self.settings
        attempts = max(1, settings.max_attempts)
        last_problem = "no attempt made"
        last_status: int | None = None
        for attempt in range(1, attempts + 1):
            delay = None
            try:
                return send()
            except requests.HTTPError as exc:
                response = exc.response
                if response is None:
                    raise TransportError(f"{feed}: GET {shown} failed: {redact(exc)[:300]}") from None
                status = response.status_code
                if status == 429:
                    wait = _retry_after_seconds(response.headers.get("Retry-After"), self.clock)
                    if wait is not None and wait > settings.retry_after_max_s:
                        raise RateLimitedError(
                            f"{feed}: GET {shown} rate limited (429); server asks to wait {wait:.0f} s, more than "
                            f"retry_after_max_s={settings.retry_after_max_s:g}",
                            status,
                            shown,
                        ) from None
                    if attempt == attempts:
                        raise RateLimitedError(
                            f"{feed}: GET {shown} still rate limited (429) after {attempts} attempts", status, shown
                        ) from None
                    last_problem, delay = "rate limited (429)", wait
                elif status >= 500:
                    last_status = status
                    last_problem = f"HTTP {status}: {redact(response.text)[:200]!r}"
                else:
                    hint = " (check the credentials)" if status in (401, 403) else ""
                    raise HttpStatusError(
                        f"{feed}: GET {shown} failed with HTTP {status}{hint}: {redact(response.text)[:300]!r}",
                        status,
                        shown,
                    ) from None
            except requests.Timeout as exc:
                last_status = None
                last_problem = (
                    f"timed out ({type(exc).__name__}; connect {settings.connect_timeout_s:g} s, "
                    f"read {settings.read_timeout_s:g} s)"
                )
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
                last_status = None
                last_problem = f"connection failed ({type(exc).__name__}: {redact(exc)[:300]})"
            except requests.RequestException as exc:
                raise TransportError(f"{feed}: GET {shown} failed: {redact(exc)[:300]}") from None
            if attempt < attempts:
                delay = self._backoff(attempt) if delay is None else delay
                log.warning(
                    "%s: GET %s %s; retrying in %.2f s (attempt %d/%d)",
                    feed,
                    shown,
                    last_problem,
                    delay,
                    attempt,
                    attempts,
                )
                self.sleep(delay)
        if last_status is not None:
            raise HttpStatusError(
                f"{feed}: GET {shown} failed after {attempts} attempts: {last_problem}", last_status, shown
            )
        raise TransportError(f"{feed}: GET {shown} failed after {attempts} attempts: {last_problem}")


def make_client(settings: HttpSettings | None = None, **kwargs: Any) -> HttpClient:
    return HttpClient(settings or HttpSettings(), **kwargs)


__all__ = [
    "CREDENTIALS",
    "ConnectorError",
    "CredentialSpec",
    "HttpClient",
    "HttpSettings",
    "HttpStatusError",
    "MissingCredentialError",
    "PayloadError",
    "RateLimitedError",
    "ResponseCache",
    "TransportError",
    "cache_key",
    "default_cache_dir",
    "get_credentials",
    "make_client",
    "redact",
    "redact_url",
    "register_secret",
]
