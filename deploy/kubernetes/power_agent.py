"""GPU power-limit node agent: applies the planner's power limit of each running Pod to that Pod's GPUs.

The planner's `kubernetes` executor sets the annotation ``carbonplanner.io/power-limit-w`` on each Pod (the
dispatch limit, then every change a later plan makes while the Pod runs). This agent runs on every GPU node (the
DaemonSet in this directory, as root) and, every `--interval` seconds, lists the planner's Pods bound to its node
and makes each GPU's limit what those Pods ask:

* a GPU's wanted limit is the highest limit among the running Pods on it (a shared GPU is never held below the
  limit of one of its Pods); the GPUs of a Pod are the indices of its assignment (``gpu_devices`` of the
  annotation ``carbonplanner.io/item``, as ``alibabacloud.com/gpu-index`` says too);
* GPUs whose wanted limit differs from what the agent last set get ``nvidia-smi -i <indices> -pl <watts>``, one
  call per limit; GPUs it set whose Pods have all ended go back to their default limit
  (``nvidia-smi --query-gpu=index,power.default_limit``);
* each Pod whose GPUs now run at a new limit gets ``carbonplanner.io/power-limit-applied-w`` (what its GPUs run at).

A failed GPU call is logged and retried at the next poll; the Pod's job keeps running (fail-open). Stand-alone on
purpose, like gate_release.py: the Python standard library only. Inside a Pod it uses the service account and
NODE_NAME (downward API); elsewhere set KUBERNETES_API, TOKEN_FILE and NODE_NAME. GPU_TOOL replaces nvidia-smi.

    python power_agent.py [--namespace gpu-jobs] [--node gpu-node-1] [--interval 30] [--once]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # k8s_rest.py beside it, in the same ConfigMap
from k8s_rest import Api, api_from_env, default_namespace  # noqa: E402

LIMIT = "carbonplanner.io/power-limit-w"
APPLIED = "carbonplanner.io/power-limit-applied-w"
ITEM = "carbonplanner.io/item"
SELECTOR = "app.kubernetes.io/managed-by=carbon-planner"


def watts_text(watts: float) -> str:
    """Watts as the annotations hold them: at most two decimals, no trailing zeros."""
    return f"{round(float(watts), 2):.2f}".rstrip("0").rstrip(".")


def pod_devices(pod: dict) -> list[int]:
    """The GPU indices of the Pod's assignment; ValueError when they cannot be read."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    try:
        text = json.loads(annotations.get(ITEM) or "{}").get("gpu_devices")
        return sorted({int(d) for d in str(text or "").split(",") if d.strip()})
    except ValueError as exc:
        raise ValueError(f"gpu_devices of annotation {ITEM} unreadable: {exc}") from None


def _running_here(pod: dict, node: str) -> bool:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    return spec.get("nodeName") == node and status.get("phase") == "Running" and not meta.get("deletionTimestamp")


def asked_limits(pods: list[dict], node: str) -> tuple[dict[str, tuple[float, list[int]]], dict[str, str]]:
    """(Pod name -> (limit, GPU indices) of the running Pods on `node` that ask a limit, Pod name -> why its
    annotations cannot be read): a bad Pod is reported and left out, the others are served."""
    asks, problems = {}, {}
    for pod in pods:
        name = pod.get("metadata", {}).get("name")
        raw = (pod.get("metadata", {}).get("annotations") or {}).get(LIMIT)
        if raw is None or not _running_here(pod, node):
            continue
        try:
            try:
                watts = float(raw)
            except ValueError:
                watts = float("nan")
            if not 0 < watts < float("inf"):
                raise ValueError(f"annotation {LIMIT} must be a positive number of watts, got {raw!r}")
            asks[name] = (watts, pod_devices(pod))
        except ValueError as exc:
            problems[name] = f"Pod {name}: {exc}"
    return asks, problems


def wanted_limits(asks: dict[str, tuple[float, list[int]]]) -> dict[int, float]:
    """GPU index -> the limit it should run at: the highest its Pods ask (see the module doc)."""
    wanted: dict[int, float] = {}
    for watts, devices in asks.values():
        for device in devices:
            wanted[device] = max(watts, wanted.get(device, 0.0))
    return wanted


def limit_commands(wanted: dict[int, float], applied: dict[int, float], tool: str = "nvidia-smi") -> list[list[str]]:
    """The GPU tool calls that bring the GPUs from `applied` (what the agent set) to `wanted`: one per limit."""
    by_watts: dict[float, list[int]] = {}
    for device, watts in sorted(wanted.items()):
        if applied.get(device) != watts:
            by_watts.setdefault(watts, []).append(device)
    return [[tool, "-i", ",".join(map(str, devices)), "-pl", watts_text(watts)] for watts, devices in by_watts.items()]


def default_query(devices: list[int], tool: str = "nvidia-smi") -> list[str]:
    return [tool, "-i", ",".join(map(str, devices)), "--query-gpu=index,power.default_limit",
            "--format=csv,noheader,nounits"]  # fmt: skip


def parse_defaults(text: str) -> dict[int, float]:
    """`index, watts` lines of the default-limit query."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            index, watts = (part.strip() for part in line.split(","))
            out[int(index)] = float(watts)
    return out


def applied_annotations(
    pods: list[dict], asks: dict[str, tuple[float, list[int]]], limits: dict[int, float]
) -> dict[str, str]:
    """Pod name -> the limit its GPUs now run at (`limits`: GPU -> set), for the Pods of `asks` whose annotation
    ``carbonplanner.io/power-limit-applied-w`` says otherwise."""
    out = {}
    for pod in pods:
        name = pod.get("metadata", {}).get("name")
        devices = [d for d in asks.get(name, (0.0, []))[1] if d in limits]
        if not devices:
            continue
        value = watts_text(max(limits[d] for d in devices))
        if (pod["metadata"].get("annotations") or {}).get(APPLIED) != value:
            out[name] = value
    return out


def _run(command: list[str]) -> str:
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def poll(api: Api, namespace: str, node: str, applied: dict[int, float], tool: str, run=_run) -> list[str]:
    """One round: list the node's Pods, set the GPUs' limits, record them on the Pods; `applied` (GPU -> what the
    agent set) is updated in place. Returns the tool calls made."""
    query = f"labelSelector={quote(SELECTOR)}&fieldSelector={quote(f'spec.nodeName={node}')}"
    pods = api.call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods?{query}").get("items", [])
    asks, problems = asked_limits(pods, node)
    for problem in problems.values():
        print(f"power limit not read: {problem}", file=sys.stderr)
    wanted = wanted_limits(asks)
    idle = sorted(set(applied) - set(wanted))
    commands = limit_commands(wanted, applied, tool)
    if idle:  # their Pods ended: back to the default limit
        try:
            commands += limit_commands(parse_defaults(run(default_query(idle, tool))), {}, tool)
        except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"default power limits not read: {exc}", file=sys.stderr)
    done = []
    for command in commands:
        try:
            run(command)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:  # fail-open: retried at the next poll
            print(f"power limit not set: {exc}", file=sys.stderr)
            continue
        devices = [int(d) for d in command[2].split(",")]
        for device in devices:
            if device in wanted:
                applied[device] = wanted[device]
            else:
                applied.pop(device, None)
        done.append(" ".join(command))
    for name, value in applied_annotations(pods, asks, applied).items():
        path = f"/metadata/annotations/{APPLIED.replace('~', '~0').replace('/', '~1')}"
        try:
            api.call(
                "PATCH",
                f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
                [{"op": "add", "path": path, "value": value}],
                "application/json-patch+json",
            )
        except urllib.error.HTTPError as exc:
            if exc.code not in (404, 422):  # gone meanwhile
                raise
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default=default_namespace())
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"))
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--once", action="store_true", help="one round, then exit")
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node or NODE_NAME is required")
    api = api_from_env()
    tool = os.environ.get("GPU_TOOL", "nvidia-smi")
    applied: dict[int, float] = {}
    while True:
        try:
            for line in poll(api, args.namespace or "gpu-jobs", args.node, applied, tool):
                print(line, flush=True)
        except (OSError, ValueError, RuntimeError, urllib.error.URLError) as exc:
            if args.once:
                raise
            print(f"poll failed: {exc}", file=sys.stderr, flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
