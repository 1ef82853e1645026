"""Fail-open gate release: removes the planner's scheduling gate from every Pod whose latest timely start has come.

The planner's executor removes a Pod's gate ``carbonplanner.io/start-time`` at its planned start. If the planner
is down, this script (run by the CronJob in this directory, every five minutes) removes it once the Pod's
annotation ``carbonplanner.io/latest-start`` has passed, so a dispatched job never waits forever for its gate
owner. Cancelled Pods (annotation ``carbonplanner.io/cancelled-at``) keep their gate.

Stand-alone on purpose: the Python standard library only, no planner code, so it keeps working when the planner's
image or warehouse does not. Inside a Pod it uses the service account (token, CA, namespace); elsewhere set
KUBERNETES_API, and TOKEN_FILE or no token. ``--now`` (ISO time) replaces the wall clock, for tests.

    python gate_release.py [--namespace gpu-jobs] [--now 2026-11-26T12:00:00Z] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # k8s_rest.py beside it, in the same ConfigMap
from k8s_rest import Api, api_from_env, default_namespace  # noqa: E402

GATE = "carbonplanner.io/start-time"
LATEST = "carbonplanner.io/latest-start"
CANCELLED = "carbonplanner.io/cancelled-at"
SELECTOR = "app.kubernetes.io/managed-by=carbon-planner"


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def due(pod: dict, now: datetime) -> int | None:
    """The index of the planner's gate when the Pod is due for release, else None (also for a Pod being deleted:
    it will never run)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    annotations = pod.get("metadata", {}).get("annotations") or {}
    gates = pod.get("spec", {}).get("schedulingGates") or []
    index = next((i for i, g in enumerate(gates) if g.get("name") == GATE), None)
    if index is None or CANCELLED in annotations or LATEST not in annotations:
        return None
    return index if _time(annotations[LATEST]) <= now else None


def release(api: Api, namespace: str, now: datetime, dry_run: bool = False) -> list[str]:
    pods = api.call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods?labelSelector={quote(SELECTOR)}")
    released = []
    for pod in pods.get("items", []):
        index = due(pod, now)
        if index is None:
            continue
        name = pod["metadata"]["name"]
        path = f"/spec/schedulingGates/{index}"
        ops = [{"op": "test", "path": f"{path}/name", "value": GATE}, {"op": "remove", "path": path}]
        if not dry_run:
            try:
                api.call(
                    "PATCH",
                    f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
                    ops,
                    "application/json-patch+json",
                )
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 409, 422):  # gone, or released meanwhile
                    continue
                raise
        released.append(name)
    return released


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default=default_namespace())
    parser.add_argument("--now", help="ISO time instead of the wall clock")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    api = api_from_env()
    now = _time(args.now) if args.now else datetime.now(UTC)
    for name in release(api, args.namespace or "gpu-jobs", now, args.dry_run):
        print(f"released {args.namespace}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
