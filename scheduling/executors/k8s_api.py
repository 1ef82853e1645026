"""The Kubernetes API calls of the `kubernetes` executor, through the official client (`kubernetes` package).

One `PodApi` per cluster connection: a kubeconfig context (``context``, ``kubeconfig_path``; default the current
context of $KUBECONFIG or ~/.kube/config), or an API server URL (``host``) with a bearer token read from the
environment variable ``token_env`` and a CA bundle ``ca_cert_path``, or, with none of them, the in-cluster service
account. Only Pods in one namespace are touched: create, list by label selector, JSON patch, delete. Reads come
back as plain dicts (the API's JSON), so the executor does not depend on the client's model classes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

CONNECTION_KEYS = ("context", "kubeconfig_path", "host", "token_env", "ca_cert_path", "namespace")


class ApiError(RuntimeError):
    """An API call answered with an error status (`status`: the HTTP code)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


def api_client(settings: Mapping[str, Any]):
    """A `kubernetes.client.ApiClient` for one connection's settings (see the module doc)."""
    if settings.get("host"):
        cfg = client.Configuration()
        cfg.host = str(settings["host"]).rstrip("/")
        if settings.get("token_env"):
            token = os.environ.get(str(settings["token_env"]))
            if not token:
                raise ValueError(f"environment variable {settings['token_env']!r} (setting 'token_env') is not set")
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        if settings.get("ca_cert_path"):
            cfg.ssl_ca_cert = str(settings["ca_cert_path"])
        return client.ApiClient(cfg)
    if settings.get("context") or settings.get("kubeconfig_path"):
        return config.new_client_from_config(
            config_file=settings.get("kubeconfig_path"), context=settings.get("context")
        )
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


class PodApi:
    """Pods of one namespace on one cluster connection."""

    def __init__(self, settings: Mapping[str, Any], namespace: str):
        self.namespace = namespace
        self.api = client.CoreV1Api(api_client(settings))

    def _call(self, method: str, *args, **kwargs):
        try:
            response = getattr(self.api, method)(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise ApiError(int(exc.status or 0), str(exc.reason or exc.body)) from None
        data = response.data
        return json.loads(data) if data else {}

    def create(self, pod: dict) -> dict:
        return self._call("create_namespaced_pod", self.namespace, pod)

    def list(self, label_selector: str) -> list[dict]:
        return list(self._call("list_namespaced_pod", self.namespace, label_selector=label_selector).get("items", []))

    def patch(self, name: str, operations: list[dict]) -> dict:
        """A JSON patch (RFC 6902; the client sends a list body as application/json-patch+json)."""
        return self._call("patch_namespaced_pod", name, self.namespace, operations)

    def delete(self, name: str, grace_period_s: int | None = None) -> dict:
        """Delete the Pod; `grace_period_s`: the seconds its containers get between SIGTERM and SIGKILL."""
        if grace_period_s is None:
            return self._call("delete_namespaced_pod", name, self.namespace)
        return self._call("delete_namespaced_pod", name, self.namespace, grace_period_seconds=int(grace_period_s))


class DeploymentApi:
    """apps/v1 Deployments of one namespace on one cluster connection (the inference services' replicas)."""

    def __init__(self, settings: Mapping[str, Any], namespace: str):
        self.namespace = namespace
        self.api = client.AppsV1Api(api_client(settings))

    _call = PodApi._call

    def create(self, deployment: dict) -> dict:
        return self._call("create_namespaced_deployment", self.namespace, deployment)

    def get(self, name: str) -> dict | None:
        """The Deployment, or None where there is none."""
        try:
            return self._call("read_namespaced_deployment", name, self.namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, label_selector: str) -> list[dict]:
        found = self._call("list_namespaced_deployment", self.namespace, label_selector=label_selector)
        return list(found.get("items", []))

    def patch(self, name: str, operations: list[dict]) -> dict:
        """A JSON patch (RFC 6902)."""
        return self._call("patch_namespaced_deployment", name, self.namespace, operations)
