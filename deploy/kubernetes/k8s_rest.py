"""The Kubernetes API over plain HTTPS for the stand-alone scripts beside it (gate_release.py, power_agent.py, in
the same ConfigMaps): the Python standard library only. Inside a Pod the service account's token, CA and
namespace; elsewhere KUBERNETES_API, TOKEN_FILE, CA_FILE and NAMESPACE."""

from __future__ import annotations

import json
import os
import ssl
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def read_text(path: str) -> str | None:
    """The stripped text of `path`, None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


class Api:
    def __init__(self, base: str, token: str | None, cafile: str | None):
        self.base = base.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=cafile) if base.startswith("https") else None

    def call(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
            return json.loads(response.read() or b"{}")


def default_namespace() -> str | None:
    return os.environ.get("NAMESPACE") or read_text(f"{ACCOUNT}/namespace")


def api_from_env() -> Api:
    """The API server of the Pod's cluster (or KUBERNETES_API), with the service account's token and CA."""
    base = os.environ.get("KUBERNETES_API") or (
        f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
    )
    token = read_text(os.environ.get("TOKEN_FILE", f"{ACCOUNT}/token"))
    cafile = os.environ.get("CA_FILE", f"{ACCOUNT}/ca.crt")
    return Api(base, token, cafile if os.path.exists(cafile) else None)
