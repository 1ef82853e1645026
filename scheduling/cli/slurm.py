"""`python -m scheduling slurm-nodes`: a Slurm cluster's nodes as a fleet file's declared `nodes:` (name, gpus,
cpus, memory_mib), read from `sinfo --json`, so that the fleet plans on the machines Slurm runs."""

from __future__ import annotations

import sys

import yaml

from scheduling.executors.slurm_cli import SlurmCli, SlurmUnavailable, discover_nodes

FLEET_KEYS = ("name", "gpus", "cpus", "memory_mib")


def fleet_nodes(conf: str | None = None) -> list[dict]:
    return [{k: n[k] for k in FLEET_KEYS} for n in discover_nodes(SlurmCli(conf=conf))]


def cmd_slurm_nodes(args) -> int:
    try:
        nodes = fleet_nodes(args.conf)
    except SlurmUnavailable as exc:
        print(f"slurm-nodes: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump({"nodes": [dict(n) for n in nodes]}, sort_keys=False, default_flow_style=None))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "slurm-nodes",
        help="a Slurm cluster's nodes (GPUs, CPUs, memory) as the fleet file's declared nodes",
        description="Read the nodes of a Slurm cluster (sinfo --json) and print them as YAML for a cluster's `nodes:`.",
    )
    p.add_argument("--conf", default=None, help="SLURM_CONF of the cluster (default: Slurm's own)")
    p.set_defaults(func=cmd_slurm_nodes)
