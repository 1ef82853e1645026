"""A local Kubernetes API server for tests: a real `http.server` on 127.0.0.1 that speaks enough of the core/v1
Pod API for create, get, list (equality label selectors, the field selector spec.nodeName), JSON patch (RFC 6902)
and delete, and of apps/v1 Deployments for create, get, list and JSON patch, keeps them in memory
and records every request. No cluster runs on the test machines; this is what the executor's client calls reach.

It enforces the API rules the executor relies on: a Pod name is unique in its namespace (409), a Pod may not set
both schedulingGates and nodeName (422), gates may be removed but never added (422), and a JSON patch `test` that
fails refuses the whole patch (422). A bearer token, when given, is required (401). Finalizers work as on a real
server: deleting a Pod that has some only sets ``metadata.deletionTimestamp`` (at `now`, the server's wall clock,
settable), no finalizer may be added to a Pod being deleted (422), and the Pod goes once its last one is removed.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

_POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$")
_DEPLOYMENT = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments(?:/([^/]+))?$")


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 add/remove/replace/test on a copy of `doc`; ValueError when an op cannot apply."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key = int(last) if isinstance(target, list) and last != "-" else last
        if op["op"] == "test":
            if target[key] != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "remove":
            del target[key]
        elif op["op"] in ("add", "replace"):
            if isinstance(target, list):
                target.insert(len(target) if key == "-" else key, op["value"])
            else:
                if op["op"] == "replace" and key not in target:
                    raise ValueError(f"replace: {op['path']} does not exist")
                target[key] = op["value"]
        else:
            raise ValueError(f"unsupported op {op['op']!r}")
    return doc


def _matches(pod: dict, selector: str) -> bool:
    labels = pod["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class KubeApiServer:
    """`with KubeApiServer(token="t") as api:` ... `api.url`, `api.pods[(ns, name)]`, `api.requests`."""

    def __init__(self, token: str | None = None):
        self.token = token
        self.pods: dict[tuple[str, str], dict] = {}
        self.deployments: dict[tuple[str, str], dict] = {}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._uid = 0
        self.now: str | None = None  # the server's wall clock for deletionTimestamp (ISO; None: the real one)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                return

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlparse(self.path)
                body = json.loads(raw) if raw else None
                with server.lock:
                    server.requests.append(
                        {
                            "method": self.command,
                            "path": url.path,
                            "query": {k: v[0] for k, v in parse_qs(url.query).items()},
                            "content_type": self.headers.get("Content-Type"),
                            "authorization": self.headers.get("Authorization"),
                            "body": body,
                        }
                    )
                    code, answer = server.answer(self.command, url, body, self.headers.get("Authorization"))
                self._send(code, answer)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> KubeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def answer(self, method: str, url, body, authorization: str | None) -> tuple[int, dict]:
        if self.token is not None and authorization != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        deployment = _DEPLOYMENT.match(url.path)
        if deployment is not None:
            return self._deployment(method, url, body, unquote(deployment.group(1)),
                                    deployment.group(2) and unquote(deployment.group(2)))  # fmt: skip
        match = _POD.match(url.path)
        if match is None:
            return 404, _status(404, "NotFound", f"no route {url.path}")
        namespace, name = unquote(match.group(1)), match.group(2) and unquote(match.group(2))
        if name is None and method == "GET":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            items = [copy.deepcopy(p) for (ns, _), p in sorted(self.pods.items()) if ns == namespace]
            items = [p for p in items if _matches(p, selector)]
            fields = parse_qs(url.query).get("fieldSelector", [""])[0]
            for term in filter(None, fields.split(",")):
                key, _, value = term.partition("=")
                if key != "spec.nodeName":
                    return 400, _status(400, "BadRequest", f"field selector {key!r} not supported here")
                items = [p for p in items if p["spec"].get("nodeName") == value]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if name is None and method == "POST":
            return self._create(namespace, body)
        pod = self.pods.get((namespace, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if method == "GET":
            return 200, pod
        if method == "DELETE":
            return 200, self._delete(namespace, name)
        if method == "PATCH":
            try:
                patched = _patch(pod, body)
            except (ValueError, KeyError, IndexError) as exc:
                return 422, _status(422, "Invalid", str(exc))
            before = {g["name"] for g in pod["spec"].get("schedulingGates") or []}
            after = {g["name"] for g in patched["spec"].get("schedulingGates") or []}
            if after - before:
                return 422, _status(422, "Invalid", "spec.schedulingGates: only deletion is allowed")
            deleting = "deletionTimestamp" in pod["metadata"]
            added = set(patched["metadata"].get("finalizers") or []) - set(pod["metadata"].get("finalizers") or [])
            if deleting and added:
                return 422, _status(422, "Forbidden", "no new finalizers can be added if the object is being deleted")
            self.pods[(namespace, name)] = patched
            if deleting and not patched["metadata"].get("finalizers"):
                del self.pods[(namespace, name)]
            return 200, patched
        return 405, _status(405, "MethodNotAllowed", method)

    def _deployment(self, method: str, url, body, namespace: str, name: str | None) -> tuple[int, dict]:
        """apps/v1 Deployments: create (409 on a taken name), get, list by label selector, JSON patch."""
        if name is None and method == "GET":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            items = [copy.deepcopy(d) for (ns, _), d in sorted(self.deployments.items()) if ns == namespace]
            return 200, {"kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {},
                         "items": [d for d in items if _matches(d, selector)]}  # fmt: skip
        if name is None and method == "POST":
            key = (namespace, body["metadata"]["name"])
            if key in self.deployments:
                return 409, _status(409, "AlreadyExists", f'deployments.apps "{key[1]}" already exists')
            self._uid += 1
            stored = copy.deepcopy(body)
            stored["metadata"]["uid"] = f"uid-{self._uid}"
            self.deployments[key] = stored
            return 201, stored
        found = self.deployments.get((namespace, name))
        if found is None:
            return 404, _status(404, "NotFound", f'deployments.apps "{name}" not found')
        if method == "GET":
            return 200, found
        if method == "PATCH":
            try:
                self.deployments[(namespace, name)] = _patch(found, body)
            except (ValueError, KeyError, IndexError) as exc:
                return 422, _status(422, "Invalid", str(exc))
            return 200, self.deployments[(namespace, name)]
        return 405, _status(405, "MethodNotAllowed", method)

    def _create(self, namespace: str, pod: dict) -> tuple[int, dict]:
        name = pod["metadata"]["name"]
        if (namespace, name) in self.pods:
            return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
        if pod["spec"].get("schedulingGates") and pod["spec"].get("nodeName"):
            return 422, _status(422, "Invalid", "spec.nodeName: Forbidden: cannot be set until all schedulingGates")
        self._uid += 1
        stored = copy.deepcopy(pod)
        stored["metadata"]["uid"] = f"uid-{self._uid}"
        stored["status"] = {"phase": "Pending"}
        self.pods[(namespace, name)] = stored
        return 201, stored

    def _delete(self, namespace: str, name: str) -> dict:
        pod = self.pods[(namespace, name)]
        if not pod["metadata"].get("finalizers"):
            return self.pods.pop((namespace, name))
        when = self.now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"].setdefault("deletionTimestamp", when)
        return pod

    def delete_pod(self, namespace: str, name: str, at: str) -> None:
        """What the Pod garbage collector, a node drain or `kubectl delete` does, at wall time `at` (ISO)."""
        with self.lock:
            self.now, before = at, self.now
            try:
                self._delete(namespace, name)
            finally:
                self.now = before

    # --------------------------------------------------------------------------------- what a kubelet would do

    def run_pod(
        self,
        namespace: str,
        name: str,
        started: str,
        finished: str | None = None,
        exit_code: int = 0,
        node: str | None = None,
    ):
        """Mark a Pod started at `started` (and ended at `finished` with `exit_code`), wall-clock ISO times; bound
        to `node` (spec.nodeName, as the scheduler binds it) when given."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            if node is not None:
                pod["spec"]["nodeName"] = node
            if finished is None:
                state, phase = {"running": {"startedAt": started}}, "Running"
            else:
                state = {"terminated": {"startedAt": started, "finishedAt": finished, "exitCode": exit_code}}
                phase = "Succeeded" if exit_code == 0 else "Failed"
            pod["status"] = {
                "phase": phase,
                "startTime": started,
                "containerStatuses": [{"name": "main", "state": state}],
            }
