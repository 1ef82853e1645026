"""`chat`: an OpenAI-compatible chat endpoint narrates the same record; the template text on any error.

Optional, never required. Configured by the Airflow Connection `explainer_llm` (host = base URL, password = API
key, extra {"model": ...}) -- read from `AIRFLOW_CONN_EXPLAINER_LLM` (JSON or URI) or, inside an Airflow task,
through the Connection API -- or by the environment variables `EXPLAINER_LLM_BASE_URL`, `EXPLAINER_LLM_API_KEY`,
`EXPLAINER_LLM_MODEL`. It sends POST {base_url}/v1/chat/completions with a bearer key and falls back to the
template text on any error (no configuration, network error, HTTP error, malformed answer, empty text). The key
is never logged.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

import requests

from common.jsonutil import canonical_json
from scheduling.explain.template import TemplateExplainer

log = logging.getLogger(__name__)

CONN_ID = "explainer_llm"
DEFAULT_MODEL = "gpt-4o-mini"


@dataclass
class ChatConfig:
    base_url: str
    api_key: str | None
    model: str
    timeout_s: float = 20.0

    def __repr__(self) -> str:  # never show the key
        return (
            f"ChatConfig(base_url={self.base_url!r}, model={self.model!r}, api_key={'***' if self.api_key else None})"
        )


def _from_conn_json(raw: str) -> dict | None:
    raw = raw.strip()
    if raw.startswith("{"):
        data = json.loads(raw)
        extra = data.get("extra") or {}
        if isinstance(extra, str):
            extra = json.loads(extra) if extra.strip() else {}
        host = data.get("host") or ""
        if data.get("port") and "://" in host and host.rstrip("/").count(":") < 2:
            host = f"{host.rstrip('/')}:{data['port']}"
        if host and "://" not in host:
            schema = data.get("schema") or data.get("conn_type") or "http"
            schema = schema if schema in ("http", "https") else "http"
            host = f"{schema}://{host}" + (f":{data['port']}" if data.get("port") else "")
        return {"host": host, "password": data.get("password"), "extra": extra}
    # URI form: http://:KEY@host:port/?model=...  (conn type http/https)
    parts = urlsplit(raw)
    extra = dict(parse_qsl(parts.query))
    if "__extra__" in extra:
        extra = json.loads(extra["__extra__"])
    scheme = parts.scheme if parts.scheme in ("http", "https") else "http"
    host = f"{scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return {"host": host, "password": unquote(parts.password) if parts.password else None, "extra": extra}


def load_chat_config(conn_id: str = CONN_ID) -> ChatConfig | None:
    """The chat endpoint's settings, or None when none is configured (see the module doc for the order)."""
    conn: dict | None = None
    raw = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if raw:
        try:
            conn = _from_conn_json(raw)
        except Exception as exc:  # noqa: BLE001 - a bad setting means: no chat
            log.warning("ignoring AIRFLOW_CONN_%s: %s", conn_id.upper(), type(exc).__name__)
    if conn is None and os.environ.get("AIRFLOW_CTX_DAG_ID"):
        try:  # inside an Airflow task: the Connection API (metadata DB, secrets backends)
            from airflow.sdk import BaseHook  # noqa: PLC0415 - Airflow is only there inside a task

            c = BaseHook.get_connection(conn_id)
            conn = {"host": c.host or "", "password": c.password, "extra": c.extra_dejson or {}}
            if c.port and c.host and "://" in c.host and c.host.rstrip("/").count(":") < 2:
                conn["host"] = f"{c.host.rstrip('/')}:{c.port}"
        except Exception:  # noqa: BLE001 - no such connection
            conn = None
    if conn is None and os.environ.get("EXPLAINER_LLM_BASE_URL"):
        conn = {
            "host": os.environ["EXPLAINER_LLM_BASE_URL"],
            "password": os.environ.get("EXPLAINER_LLM_API_KEY"),
            "extra": {"model": os.environ.get("EXPLAINER_LLM_MODEL")},
        }
    if not conn or not conn.get("host"):
        return None
    base = str(conn["host"]).rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    extra = conn.get("extra") or {}
    model = extra.get("model") or os.environ.get("EXPLAINER_LLM_MODEL") or DEFAULT_MODEL
    timeout = float(extra.get("timeout_s", 20.0))
    return ChatConfig(base_url=base, api_key=conn.get("password") or None, model=str(model), timeout_s=timeout)


SYSTEM_PROMPT = (
    "You explain scheduling decisions of a carbon-aware GPU job planner to the job's owner. Write at most six "
    "short sentences of plain text. Use only the facts given; keep every number as given (kgCO2e, times in UTC)."
)


class ChatExplainer:
    """Asks an OpenAI-compatible chat endpoint for the card text; the template's text on any error."""

    def __init__(self, config: ChatConfig | None, fallback: TemplateExplainer | None = None):
        self.config = config
        self.fallback = fallback or TemplateExplainer()
        self.last_error: str | None = None

    @classmethod
    def from_config(cls, conn_id: str = CONN_ID) -> ChatExplainer:
        return cls(load_chat_config(conn_id))

    def explain(self, record: dict) -> str:
        template = self.fallback.explain(record)
        if self.config is None:
            self.last_error = "no chat endpoint configured"
            return template
        try:
            text = self._ask(record, template)
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the template
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("chat explainer failed (%s); using the template text", type(exc).__name__)
            return template
        self.last_error = None
        return text

    def _ask(self, record: dict, template: str) -> str:
        cfg = self.config
        headers = {"Content-Type": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        body = {
            "model": cfg.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": "Decision record (JSON):\n"
                    + canonical_json(record)
                    + "\n\nA factual summary:\n"
                    + template
                    + "\n\nExplain this decision.",
                },
            ],
        }
        host = urlsplit(cfg.base_url).hostname or ""
        # A local endpoint is never reached through an environment proxy.
        proxies = {"http": None, "https": None} if host in ("127.0.0.1", "localhost", "::1") else None
        resp = requests.post(
            f"{cfg.base_url}/v1/chat/completions", json=body, headers=headers, timeout=cfg.timeout_s, proxies=proxies
        )
        resp.raise_for_status()
        data = resp.json()
        content = data["choices"][0]["message"]["content"]
        if not isinstance(content, str) or not content.strip():
            raise ValueError("empty answer")
        return content.strip()
