"""Explanation cards: the deterministic template, and the optional chat explainer against a small fake
OpenAI-compatible server on 127.0.0.1 (a real http.server in a thread), falling back to the template on errors."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduling.explain.chat import ChatExplainer, load_chat_config
from scheduling.explain.registry import make_explainer
from scheduling.explain.template import TemplateExplainer
from tests.scheduling.test_plan_store import sample_plan

RECORD = sample_plan().explanations[0]


class FakeChat:
    """POST /v1/chat/completions -> a chat.completion JSON; `mode` switches to failures."""

    def __init__(self):
        self.requests: list[dict] = []
        self.mode = "ok"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": "not found"}})
                if fake.mode == "error":
                    return self._send(500, {"error": {"message": "overloaded"}})
                if fake.mode == "garbage":
                    return self._send(200, {"unexpected": True})
                if fake.mode == "empty":
                    content = "   "
                else:
                    content = f"LLM card for {body['messages'][-1]['content'].count('job-00000')} mentions"
                self._send(
                    200,
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, status, doc):
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_chat():
    with FakeChat() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch):
    for var in (
        "AIRFLOW_CONN_EXPLAINER_LLM",
        "EXPLAINER_LLM_BASE_URL",
        "EXPLAINER_LLM_API_KEY",
        "EXPLAINER_LLM_MODEL",
        "PLAN_EXPLAINER",
        "AIRFLOW_CTX_DAG_ID",
    ):
        monkeypatch.delenv(var, raising=False)


def test_template_text_is_deterministic_and_complete():
    text = TemplateExplainer().explain(RECORD)
    assert text == TemplateExplainer().explain(json.loads(json.dumps(RECORD, default=str)))
    for needle in (
        "Job job-00000",
        "priority 0.500",
        "urgency 0.400",
        "flexibility 0.300",
        "opportunity 0.200",
        "in us-west (usw-v100m32)",
        "0.300 kgCO2e",
        "Alternatives considered (top five)",
        "5. us-south",
        "run now 0.900 kgCO2e",
        "greedy carbon 0.350 kgCO2e",
        "optimum 0.280 kgCO2e",
        "Binding constraints: none",
        "Forecast: naive-24@",
        "GPU limit 250 W",
    ):
        assert needle in text, needle


def test_template_survives_a_sparse_record():
    text = TemplateExplainer().explain({"job_id": "j1"})
    assert "Job j1: priority n/a" in text and "not placed" in text and "optimum not computed" in text


def test_chat_explainer_via_airflow_connection_json(fake_chat, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_EXPLAINER_LLM",
        json.dumps(
            {"conn_type": "http", "host": fake_chat.url, "password": "sk-test", "extra": {"model": "tiny-model"}}
        ),
    )
    explainer = make_explainer("chat")
    assert isinstance(explainer, ChatExplainer)
    assert "sk-test" not in repr(explainer.config)
    text = explainer.explain(RECORD)
    assert text.startswith("LLM card for") and explainer.last_error is None
    (req,) = fake_chat.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert req["body"]["model"] == "tiny-model"
    assert [m["role"] for m in req["body"]["messages"]] == ["system", "user"]
    assert "job-00000" in req["body"]["messages"][1]["content"]


def test_chat_explainer_via_env_vars_and_uri(fake_chat, monkeypatch):
    monkeypatch.setenv("EXPLAINER_LLM_BASE_URL", fake_chat.url + "/v1")
    monkeypatch.setenv("EXPLAINER_LLM_MODEL", "env-model")
    assert ChatExplainer.from_config().explain(RECORD).startswith("LLM card")
    assert fake_chat.requests[-1]["body"]["model"] == "env-model" and fake_chat.requests[-1]["auth"] is None
    port = fake_chat.server.server_address[1]
    monkeypatch.setenv("AIRFLOW_CONN_EXPLAINER_LLM", f"http://:sk-uri@127.0.0.1:{port}/?model=uri-model")
    cfg = load_chat_config()
    assert (cfg.base_url, cfg.api_key, cfg.model) == (fake_chat.url, "sk-uri", "uri-model")


@pytest.mark.parametrize("mode", ["error", "garbage", "empty"])
def test_chat_explainer_falls_back_to_the_template(fake_chat, monkeypatch, mode):
    fake_chat.mode = mode
    monkeypatch.setenv("EXPLAINER_LLM_BASE_URL", fake_chat.url)
    explainer = ChatExplainer.from_config()
    assert explainer.explain(RECORD) == TemplateExplainer().explain(RECORD)
    assert explainer.last_error


def test_chat_explainer_without_config_or_server(monkeypatch):
    assert ChatExplainer.from_config().explain(RECORD) == TemplateExplainer().explain(RECORD)
    monkeypatch.setenv("EXPLAINER_LLM_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    explainer = ChatExplainer.from_config()
    explainer.config.timeout_s = 2
    assert explainer.explain(RECORD) == TemplateExplainer().explain(RECORD)
    with pytest.raises(ValueError, match="unknown explainer"):
        make_explainer("poetry")
