"""Fleet configuration: GPU clusters in regions, each region mapped to a grid zone (see `scheduling/domain/fleet.yaml`).

A cluster holds nodes of one GPU model (a job's speed and power then depend only on the cluster), plus its PUE and
the executor that runs its jobs. Its nodes are either declared (the operator's machines) or sampled, seeded, from
the openb node list or the Alibaba PAI 2020 machine specs (the simulator's and the demos' fleets). GPU models carry
idle/peak board power, a speed source (Gavel type or a relative speed) and the Zeus power curve they borrow.

The YAML file (`FLEET_PATH` selects the hourly plan's, see `scheduling.domain.fleet_file`):

    version: 1
    seed: 7                                   # node sampling (sampled clusters only)
    signal: average                           # carbon signal the hourly plan minimises: average | marginal
    transfer: {kwh_per_gb: 0.0075}            # network energy per GB when a job runs outside its home region
    regions:   {us-west: {zone: CISO}}        # region -> grid zone of marts.grid_hourly
    gpu_models:                               # board power (W); gavel: k80|p100|v100, or relative_speed vs a V100
      A100: {idle_w: 50, peak_w: 400, relative_speed: 2.0}
    clusters:
      - name: usw-a100                        # letters, digits, '.', '_', '-'
        region: us-west
        gpu_model: A100                       # one model per cluster; a node naming another one is refused
        pue: 1.15                             # in [1, 3], default 1.2
        weight: 1.0                           # share when a sampled fleet is re-sized (default 1)
        nodes:                                # declared nodes: name, gpus, cpus | cpu_milli, memory_gib | memory_mib
          - {name: dgx-01, gpus: 8, cpus: 96, memory_gib: 1024}
          - {name: dgx-02, gpus: 8, cpus: 96, memory_gib: 1024, drain: true}   # no new job starts there
        node_groups:                          # count x one shape, named <cluster>-<name_prefix>-<i> (i from 1)
          - {count: 4, name_prefix: dgx, gpus: 8, cpus: 96, memory_gib: 1024}
        executor: {kind: slurm, partition: gpu, token_env: SLURM_JWT}   # default {kind: replay}
      - {name: uss-t4, region: us-west, gpu_model: T4, source: openb, gpus: 64}   # sampled: source + gpus

A cluster gives `source` + `gpus` (sampled) or `nodes` and/or `node_groups` (declared), never both. A declared node
or group with `drain: true` takes no new job: it stays a node of its cluster (the intake still takes jobs only it
can hold), is listed in `FleetCluster.drained`, and the plan leaves it out of its nodes and capacity
(`Fleet.schedulable`); the jobs still running there keep it until they end (the plan reports them).
`Fleet.with_drained` adds the nodes an executor's resource manager drains (Slurm's DRAIN).
`executor` is recorded and checked here, not run: `kind` is one of EXECUTOR_KINDS and the other keys are its
settings, which never hold secrets (keys such as `password` or `token` are refused; name an environment variable
with a `*_env` key or an Airflow Connection with `conn_id`). Every error names the file, the cluster and the field, e.g.
`fleet.yaml: clusters[2] (eun-a100).nodes[3].gpus: must be a positive integer, got 0`.

    from scheduling.domain.fleet import load_fleet
    fleet = load_fleet()                          # scheduling/domain/fleet.yaml, sampled nodes from DATA_DIR
    fleet = load_fleet(regions=6)                 # the first six regions (or a list of region names / zones)
    fleet = fleet.scaled(total_gpus=96)           # re-size sampled clusters in proportion to their weights
    fleet.capacity_milli                          # (C,) GPU-milli per cluster
    fleet.packing_cluster(0)                      # a fresh scheduling.packing.Cluster of cluster 0's nodes
    fleet.capacity_table()                        # region, zone, cluster, model, source, nodes, gpus, pue, executor
    fleet.executors()                             # cluster -> ExecutorConfig(kind, settings)

Sampled node counts are whole nodes: a cluster gets nodes until it reaches its GPU target (at least one node).
Declared clusters are never re-sized (`Fleet.scaled` refuses them: their nodes are real machines).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from scheduling.domain.fleet_file import DEFAULT_FLEET_PATH
from scheduling.domain.gpus import map_gpu_type
from scheduling.packing import Cluster
from warehouse.config import data_dir as configured

OPENB_NODES = Path("openb") / "openb_node_list_gpu_node.csv"
PAI_NODES = Path("interference") / "cluster_specs" / "alibaba_pai2020_machine_spec.csv"
NODE_SOURCES = ("openb", "pai")
DECLARED = "declared"  # ClusterConfig.source of a cluster whose nodes the file lists
FILE_DRAIN = "drain: true in the fleet file"  # why a node the file marks drained takes no new job
NODE_COLUMNS = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
EXECUTOR_KINDS = ("replay", "files", "slurm", "kubernetes")
GAVEL_TYPES = ("k80", "p100", "v100")

# What the file may say, per level (anything else is refused, so that a misspelt key cannot be silently ignored).
TOP_KEYS = ("version", "seed", "signal", "transfer", "regions", "gpu_models", "clusters")
# average: marts.grid_hourly's direct average intensity (attributional); marginal: WattTime's MOER (the consequence of
# adding load now) where the live feeds deliver it (docs/planner.md, "Which carbon signal")
SIGNALS = ("average", "marginal")
REGION_KEYS = ("zone",)
MODEL_KEYS = ("idle_w", "peak_w", "gavel", "relative_speed")
CLUSTER_KEYS = ("name", "region", "gpu_model", "source", "gpus", "nodes", "node_groups", "pue", "weight", "executor")
NODE_KEYS = ("name", "gpu_model", "gpus", "cpus", "cpu_milli", "memory_gib", "memory_mib", "drain")
GROUP_KEYS = ("count", "name_prefix", "gpu_model", "gpus", "cpus", "cpu_milli", "memory_gib", "memory_mib", "drain")
# Sanity bounds on declared shapes (a typo such as 80000 GPUs in a node fails loudly instead of sizing arrays).
MAX_NODE_GPUS = 64
MAX_NODE_CPUS = 10_000
MAX_NODE_MEMORY_GIB = 1 << 20
MAX_GROUP_COUNT = 10_000
MAX_SAMPLED_GPUS = 1_000_000
# Executor setting names that look like secrets; references to where a secret lives (an environment variable's
# name, an Airflow Connection id, a file path) are allowed.
SECRET_WORDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "access_key",
    "private_key",
    "ssh_key",
    "credential",
)
REFERENCE_SUFFIXES = ("_env", "_conn_id", "_file", "_path")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class GpuModel:
    name: str
    idle_w: float
    peak_w: float
    gavel: str | None = None  # k80 | p100 | v100: per-job-type speed from Gavel's measurements
    relative_speed: float | None = None  # vs a V100 where no Gavel measurement exists

    @property
    def power_profile(self) -> str:
        """The Zeus power curve this model borrows (a Zeus gpu_type, or 'default'). Defined once, in
        scheduling.domain.gpus.GPU_MAP, so the planner and the power model cannot disagree."""
        return map_gpu_type(self.name).curve


@dataclass(frozen=True)
class ExecutorConfig:
    """Which executor runs a cluster's jobs (`kind`, one of EXECUTOR_KINDS) and its connection settings (no
    secrets: those are referenced by environment variable or Airflow Connection id). Built into an executor
    elsewhere; the fleet only records and checks it."""

    kind: str = "replay"
    settings: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    region: str
    zone: str
    gpu_model: str
    source: str = "openb"  # openb | pai (sampled nodes) | declared (listed in the file)
    gpus: int = 64  # sampled: the target size; declared: the sum of the nodes' GPUs
    pue: float = 1.2
    weight: float = 1.0
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    @property
    def declared(self) -> bool:
        return self.source == DECLARED


@dataclass
class FleetCluster:
    config: ClusterConfig
    nodes: pd.DataFrame  # sn, cpu_milli, memory_mib, gpu, model
    # nodes that take no new job (their running jobs end there) -> why: `drain: true` in the file
    # (FILE_DRAIN), or the resource manager's own drain state (`Fleet.with_drained`)
    drained: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def declared(self) -> bool:
        """True when the nodes are the operator's (listed in the file), False when sampled from a node list."""
        return self.config.declared

    @property
    def executor(self) -> ExecutorConfig:
        return self.config.executor

    @property
    def n_gpus(self) -> int:
        return int(self.nodes["gpu"].sum())

    @property
    def capacity_milli(self) -> int:
        return self.n_gpus * 1000

    def schedulable(self) -> FleetCluster:
        """This cluster without its drained nodes (`Fleet.schedulable`)."""
        keep = self.nodes[~self.nodes["sn"].astype(str).isin(self.drained)].reset_index(drop=True)
        return FleetCluster(self.config, keep, self.drained)

    @property
    def max_node_gpus(self) -> int:
        return int(self.nodes["gpu"].max()) if len(self.nodes) else 0

    @property
    def max_node_cpu_milli(self) -> int:
        return int(self.nodes["cpu_milli"].max()) if len(self.nodes) else 0

    @property
    def max_node_memory_mib(self) -> int:
        return int(self.nodes["memory_mib"].max()) if len(self.nodes) else 0


@dataclass
class Fleet:
    clusters: list[FleetCluster]
    gpu_models: dict[str, GpuModel]
    regions: dict[str, str]  # region -> zone
    transfer_kwh_per_gb: float = 0.0075
    seed: int = 7
    signal: str = "average"  # the carbon signal the hourly plan minimises (SIGNALS)
    source_path: str | None = None
    _pools: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ vectors over clusters
    def __len__(self) -> int:
        return len(self.clusters)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.clusters]

    @property
    def cluster_regions(self) -> list[str]:
        return [c.config.region for c in self.clusters]

    @property
    def cluster_zones(self) -> list[str]:
        return [c.config.zone for c in self.clusters]

    @property
    def zones(self) -> list[str]:
        """Distinct zones of the selected clusters, in cluster order."""
        return list(dict.fromkeys(self.cluster_zones))

    @property
    def capacity_milli(self) -> np.ndarray:
        return np.array([c.capacity_milli for c in self.clusters], dtype=np.int64)

    @property
    def cpu_capacity(self) -> np.ndarray:
        """(C,) CPU milli-cores per cluster."""
        return np.array([int(c.nodes["cpu_milli"].sum()) for c in self.clusters], dtype=np.int64)

    @property
    def memory_capacity(self) -> np.ndarray:
        """(C,) memory MiB per cluster."""
        return np.array([int(c.nodes["memory_mib"].sum()) for c in self.clusters], dtype=np.int64)

    @property
    def resource_capacity(self) -> np.ndarray:
        """(3, C): GPU-milli, CPU milli-cores, memory MiB per cluster."""
        return np.vstack([self.capacity_milli, self.cpu_capacity, self.memory_capacity])

    @property
    def pue(self) -> np.ndarray:
        return np.array([c.config.pue for c in self.clusters], dtype=np.float64)

    @property
    def total_gpus(self) -> int:
        return int(sum(c.n_gpus for c in self.clusters))

    def model_of(self, i: int) -> GpuModel:
        return self.gpu_models[self.clusters[i].config.gpu_model]

    def index(self, name: str) -> int:
        return self.names.index(name)

    # ------------------------------------------------------------------ selection and scaling
    def select(self, regions: int | Iterable[str] | None) -> Fleet:
        """The clusters of the first `regions` regions (int), or of the named regions/zones (list)."""
        if regions is None:
            return self
        order = list(dict.fromkeys(self.cluster_regions))
        if isinstance(regions, (int, np.integer)):
            if not 1 <= regions <= len(order):
                raise ValueError(f"--regions {regions}: the fleet has {len(order)} regions ({', '.join(order)})")
            keep = set(order[: int(regions)])
        else:
            wanted = [str(r) for r in regions]
            keep = set()
            for r in wanted:
                hits = [reg for reg in order if reg == r or self.regions.get(reg) == r]
                if not hits:
                    raise ValueError(f"unknown region or zone {r!r}; fleet regions: {order}")
                keep.update(hits)
        out = copy.copy(self)
        out.clusters = [c for c in self.clusters if c.config.region in keep]
        return out

    def sampled(self) -> Fleet:
        """The fleet's sampled clusters only (declared ones are real machines of a fixed size): what the batch
        evaluations re-size to a load."""
        out = copy.copy(self)
        out.clusters = [c for c in self.clusters if not c.declared]
        if not out.clusters:
            raise ValueError("the fleet has no sampled cluster (source: openb|pai) to re-size")
        return out

    def scaled(
        self, total_gpus: float, seed: int | None = None, minimum_gpus=None, keep_declared: bool = False
    ) -> Fleet:
        """The same clusters re-sampled so that the fleet's sampled clusters have about `total_gpus` GPUs, split by
        weight (each cluster at least one node, and at least `minimum_gpus[i]` GPUs where given; `minimum_gpus`
        indexes the sampled clusters). Only sampled clusters re-size: a declared cluster's nodes are real machines,
        so a fleet holding one is refused (ValueError) rather than silently missing the target, unless
        `keep_declared`, where declared clusters stay as they are, beside the re-sized ones."""
        declared = [c.name for c in self.clusters if c.declared]
        if declared and keep_declared:
            sampled = self.sampled().scaled(total_gpus, seed, minimum_gpus)
            resized = iter(sampled.clusters)
            out = copy.copy(self)
            out.clusters = [c if c.declared else next(resized) for c in self.clusters]
            return out
        if declared:
            raise ValueError(
                f"cannot re-size the fleet to {total_gpus:g} GPUs: cluster(s) {', '.join(declared)} declare their "
                f"nodes (real machines); only clusters sampled from a node list (source: openb|pai) re-size"
            )
        weights = np.array([c.config.weight for c in self.clusters], dtype=float)
        targets = total_gpus * weights / weights.sum()
        if minimum_gpus is not None:
            targets = np.maximum(targets, np.asarray(minimum_gpus, dtype=float))
        out = copy.copy(self)
        out.clusters = [
            FleetCluster(
                replace(c.config, gpus=max(1, int(round(t)))),
                self._sample_nodes(replace(c.config, gpus=max(1, int(round(t)))), seed),
            )
            for c, t in zip(self.clusters, targets)
        ]
        return out

    # ------------------------------------------------------------------ packing
    def packing_cluster(self, i: int):
        return Cluster.from_nodes(self.clusters[i].nodes)

    def capacity_table(self) -> pd.DataFrame:
        rows = []
        for c in self.clusters:
            sizes = c.nodes["gpu"].value_counts().sort_index()
            rows.append(
                {
                    "region": c.config.region,
                    "zone": c.config.zone,
                    "cluster": c.name,
                    "gpu_model": c.config.gpu_model,
                    "source": c.config.source,
                    "nodes": len(c.nodes),
                    "gpus": c.n_gpus,
                    "node_shapes": ", ".join(f"{int(n)}x{int(g)}GPU" for g, n in sizes.items()),
                    "pue": c.config.pue,
                    "executor": c.executor.kind,
                }
            )
        return pd.DataFrame(rows)

    def with_drained(self, drained: dict[str, dict[str, str]]) -> Fleet:
        """The fleet with more nodes drained: `drained` maps a cluster to {node: why}, added to its
        `FleetCluster.drained`. Names a cluster does not have are ignored (an executor may serve several clusters
        and report all its nodes)."""
        clusters = []
        for c in self.clusters:
            names = set(c.nodes["sn"].astype(str))
            more = {n: why for n, why in drained.get(c.name, {}).items() if n in names and n not in c.drained}
            clusters.append(FleetCluster(c.config, c.nodes, {**c.drained, **more}) if more else c)
        out = copy.copy(self)
        out.clusters = clusters
        return out

    def schedulable(self) -> Fleet:
        """The fleet a plan starts new jobs on: each cluster without its drained nodes (their running jobs end
        there; `FleetCluster.drained` still names them). Itself when no node is drained."""
        if not any(c.drained for c in self.clusters):
            return self
        out = copy.copy(self)
        out.clusters = [c.schedulable() if c.drained else c for c in self.clusters]
        return out

    def executors(self) -> dict[str, ExecutorConfig]:
        """Cluster name -> the executor that runs its jobs (kind + settings), in cluster order: what whoever
        builds the executors reads (clusters sharing a kind and settings may share one executor)."""
        return {c.name: c.executor for c in self.clusters}

    # ------------------------------------------------------------------ node pools
    def _pool(self, source: str, model: str) -> pd.DataFrame:
        key = (source, model)
        if key not in self._pools:
            self._pools[key] = node_pool(source, model)
        return self._pools[key]

    def _sample_nodes(self, cfg: ClusterConfig, seed: int | None = None) -> pd.DataFrame:
        if cfg.declared:
            raise ValueError(f"cluster {cfg.name!r} declares its nodes; there is nothing to sample")
        pool = self._pool(cfg.source, cfg.gpu_model)
        return sample_nodes(pool, cfg.gpus, cfg.name, seed=self.seed if seed is None else seed)


def _data_dir(data_dir) -> Path:
    if data_dir is not None:
        return Path(data_dir)

    return configured()


_POOL_CACHE: dict[tuple[str, str, str], pd.DataFrame] = {}


def node_pool(source: str, model: str, data_dir=None) -> pd.DataFrame:
    """All nodes of one GPU model from a node source, columns sn, cpu_milli, memory_mib, gpu, model."""
    root = _data_dir(data_dir)
    key = (str(root), source, model)
    if key in _POOL_CACHE:
        return _POOL_CACHE[key]
    if source == "openb":
        path = root / OPENB_NODES
        if not path.exists():
            raise FileNotFoundError(f"openb node list not found: {path} (set DATA_DIR)")
        nodes = pd.read_csv(path)
        for col in ("sn", "cpu_milli", "memory_mib", "gpu", "model"):
            if col not in nodes.columns:
                raise ValueError(f"{path}: missing column {col!r}")
        nodes = nodes[(nodes["model"] == model) & (nodes["gpu"] > 0)]
        nodes = nodes[["sn", "cpu_milli", "memory_mib", "gpu", "model"]]
    elif source == "pai":
        path = root / PAI_NODES
        if not path.exists():
            raise FileNotFoundError(f"PAI machine specs not found: {path} (set DATA_DIR)")
        raw = pd.read_csv(path)
        for col in ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu"):
            if col not in raw.columns:
                raise ValueError(f"{path}: missing column {col!r}")
        raw = raw[(raw["gpu_type"] == model) & (raw["cap_gpu"] > 0)]
        nodes = pd.DataFrame(
            {
                "sn": "pai-" + raw["machine"].astype(str).str[:12],
                "cpu_milli": (raw["cap_cpu"].astype(float) * 1000).astype(np.int64),
                "memory_mib": (raw["cap_mem"].astype(float) * 1024).astype(np.int64),
                "gpu": raw["cap_gpu"].astype(np.int64),
                "model": model,
            }
        )
    else:
        raise ValueError(f"unknown node source {source!r}; known: {NODE_SOURCES}")
    if nodes.empty:
        raise ValueError(f"no {model} GPU nodes in the {source} node list")
    nodes = nodes.sort_values("sn").reset_index(drop=True)
    _POOL_CACHE[key] = nodes
    return nodes


def sample_nodes(pool: pd.DataFrame, gpus: int, cluster: str, seed: int = 7) -> pd.DataFrame:
    """Nodes drawn (seeded) to bring the GPU total as close to `gpus` as whole nodes allow: the pool is walked
    largest node shape first (a fixed random order per (cluster, seed) within a shape), taking every node that
    does not overshoot the target, then one smallest node more if that gets at least as close; the pool is reused
    (names suffixed #1, #2, ...) when exhausted; at least one node. Node names are prefixed with the cluster."""
    rng = np.random.default_rng([seed, _stable_hash(cluster)])
    gpu = pool["gpu"].to_numpy(np.int64)
    perm = rng.permutation(len(pool))
    order = perm[np.argsort(-gpu[perm], kind="stable")]  # largest nodes first, random within a size
    target = max(1, int(gpus))
    picked: list[tuple[int, int]] = []
    total, copy_no = 0, 0
    while total < target:
        added = False
        for idx in order:
            g = int(gpu[idx])
            if total + g <= target:
                picked.append((int(idx), copy_no))
                total += g
                added = True
        copy_no += 1
        if not added:
            break
    small = int(order[np.argmin(gpu[order])])
    if not picked or abs(total + gpu[small] - target) <= abs(total - target):
        picked.append((small, copy_no))
    rows = []
    for idx, cp in picked:
        row = pool.iloc[idx]
        rows.append(
            (
                f"{cluster}/{row['sn']}" + (f"#{cp}" if cp else ""),
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
                str(row["model"]),
            )
        )
    return pd.DataFrame(rows, columns=NODE_COLUMNS)


def _stable_hash(text: str) -> int:
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def load_fleet(
    path: str | Path | None = None, regions: int | Iterable[str] | None = None, data_dir=None, seed: int | None = None
) -> Fleet:
    """Read a fleet YAML (default scheduling/domain/fleet.yaml; the hourly plan passes `fleet_file.fleet_path()`),
    check it (ValueError naming the file, cluster and field) and build every cluster's nodes: declared ones as
    listed, sampled ones from the node lists under `data_dir`."""
    path = Path(path) if path else DEFAULT_FLEET_PATH
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    return fleet_from_spec(spec, path, regions=regions, data_dir=data_dir, seed=seed)


def fleet_from_spec(
    spec: Any,
    path: str | Path = "<fleet>",
    *,
    regions: int | Iterable[str] | None = None,
    data_dir=None,
    seed: int | None = None,
) -> Fleet:
    """The fleet of an already parsed YAML document (`path` only names it in errors and in Fleet.source_path)."""
    where = str(path)
    spec = _mapping(spec, where)
    for key in spec:
        if key not in TOP_KEYS:
            raise ValueError(f"{where}: {key}: unknown section (known: {', '.join(TOP_KEYS)})")
    for key in ("regions", "gpu_models", "clusters"):
        if key not in spec:
            raise ValueError(f"{where}: missing section {key!r}")
    if spec.get("version", 1) != 1:
        raise ValueError(f"{where}: version: must be 1, got {_show(spec['version'])}")
    region_zone = _regions(spec["regions"], f"{where}: regions")
    models = _gpu_models(spec["gpu_models"], f"{where}: gpu_models")
    transfer = _mapping(spec.get("transfer", {}), f"{where}: transfer")
    _check_keys(transfer, ("kwh_per_gb",), f"{where}: transfer")
    kwh_per_gb = _number(transfer.get("kwh_per_gb", 0.0075), f"{where}: transfer.kwh_per_gb", lo=0.0)
    fleet_seed = int(seed) if seed is not None else _int(spec.get("seed", 7), f"{where}: seed", lo=0)
    signal = spec.get("signal", "average")
    if signal not in SIGNALS:
        raise ValueError(f"{where}: signal: must be one of {', '.join(SIGNALS)}, got {_show(signal)}")
    fleet = Fleet(
        clusters=[],
        gpu_models=models,
        regions=region_zone,
        transfer_kwh_per_gb=kwh_per_gb,
        seed=fleet_seed,
        signal=signal,
        source_path=str(path),
    )
    entries = spec["clusters"]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: clusters: must be a non-empty list, got {_show(entries)}")
    first_at: dict[str, int] = {}
    parsed: list[tuple[ClusterConfig, pd.DataFrame | None, tuple[str, ...]]] = []
    for i, entry in enumerate(entries):
        cfg, nodes, drained = _cluster(entry, f"{where}: clusters[{i}]", region_zone, models)
        if cfg.name in first_at:
            also = first_at[cfg.name]
            raise ValueError(
                f"{where}: clusters[{i}] ({cfg.name}).name: duplicate cluster name (also clusters[{also}])"
            )
        first_at[cfg.name] = i
        parsed.append((cfg, nodes, drained))
    for cfg, nodes, _ in parsed:
        key = (cfg.source, cfg.gpu_model)
        if nodes is None and key not in fleet._pools:
            fleet._pools[key] = node_pool(cfg.source, cfg.gpu_model, _data_dir(data_dir))
    fleet.clusters = [
        FleetCluster(cfg, fleet._sample_nodes(cfg) if nodes is None else nodes, dict.fromkeys(drained, FILE_DRAIN))
        for cfg, nodes, drained in parsed
    ]
    return fleet.select(regions)


# ---------------------------------------------------------------------------------------------------- checking
def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be a mapping, got {_show(value)}")
    return value


def _check_keys(entry: dict, known: tuple[str, ...], where: str) -> None:
    for key in entry:
        if key not in known:
            raise ValueError(f"{where}.{key}: unknown key (known: {', '.join(known)})")


def _require(entry: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key not in entry:
            raise ValueError(f"{where}: missing key {key!r}")


def _int(value: Any, where: str, lo: int = 1, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        want = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        if hi is not None and isinstance(value, int) and not isinstance(value, bool) and value > hi:
            want += f" of at most {hi}"
        raise ValueError(f"{where}: must be {want}, got {_show(value)}")
    return int(value)


def _number(value: Any, where: str, lo: float = 0.0, hi: float | None = None, positive: bool = False) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    number = number and (isinstance(value, int) or math.isfinite(value))  # math.isfinite overflows on huge ints
    if number and (value > lo if positive else value >= lo) and (hi is None or value <= hi):
        return float(value)
    if positive:
        want = "a positive number" + (f" of at most {hi:g}" if number and hi is not None and value > hi else "")
    elif hi is None:
        want = f"a number >= {lo:g}"
    else:
        want = f"a number in [{lo:g}, {hi:g}]"
    raise ValueError(f"{where}: must be {want}, got {_show(value)}")


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{where}: must be a name of letters, digits, '.', '_' or '-' (starting with a letter or digit), "
            f"got {_show(value)}"
        )
    return value


def _choice(value: Any, options, where: str, what: str) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{where}: {_show(value)} is not {what} ({', '.join(options)})")
    return value


def _regions(value: Any, where: str) -> dict[str, str]:
    entries = _mapping(value, where)
    if not entries:
        raise ValueError(f"{where}: must name at least one region")
    out = {}
    for name, entry in entries.items():
        at = f"{where}.{name}"
        _name(name, f"{where}: region name {_show(name)}")
        entry = _mapping(entry, at)
        _check_keys(entry, REGION_KEYS, at)
        _require(entry, ("zone",), at)
        if not isinstance(entry["zone"], str) or not entry["zone"]:
            raise ValueError(f"{at}.zone: must be a grid zone name, got {_show(entry['zone'])}")
        out[name] = entry["zone"]
    return out


def _gpu_models(value: Any, where: str) -> dict[str, GpuModel]:
    entries = _mapping(value, where)
    if not entries:
        raise ValueError(f"{where}: must name at least one GPU model")
    models = {}
    for name, m in entries.items():
        at = f"{where}.{name}"
        _name(name, f"{where}: model name {_show(name)}")
        m = _mapping(m, at)
        if "power_profile" in m:  # the curve mapping has one home (scheduling/domain/gpus.py GPU_MAP)
            raise ValueError(
                f"{at}.power_profile: is not read from the fleet file; the GPU -> power-curve mapping "
                "is scheduling.domain.gpus.GPU_MAP"
            )
        _check_keys(m, MODEL_KEYS, at)
        _require(m, ("idle_w", "peak_w"), at)
        idle = _number(m["idle_w"], f"{at}.idle_w", lo=0.0)
        peak = _number(m["peak_w"], f"{at}.peak_w", positive=True)
        if peak <= idle:
            raise ValueError(f"{at}: peak_w ({peak:g}) must exceed idle_w ({idle:g})")
        gavel = m.get("gavel")
        if gavel is not None:
            _choice(gavel, GAVEL_TYPES, f"{at}.gavel", "a Gavel GPU type")
        speed = m.get("relative_speed")
        if speed is not None:
            speed = _number(speed, f"{at}.relative_speed", positive=True)
        if gavel is None and speed is None:
            raise ValueError(f"{at}: needs gavel or relative_speed")
        models[name] = GpuModel(name=name, idle_w=idle, peak_w=peak, gavel=gavel, relative_speed=speed)
    return models


def _cluster(
    entry: Any, where: str, region_zone: dict[str, str], models: dict[str, GpuModel]
) -> tuple[ClusterConfig, pd.DataFrame | None, tuple[str, ...]]:
    """One cluster entry -> (config, declared nodes or None when they are to be sampled, drained node names)."""
    c = _mapping(entry, where)
    if "name" in c:
        name = _name(c["name"], f"{where}.name")
        where = f"{where} ({name})"
    _check_keys(c, CLUSTER_KEYS, where)
    _require(c, ("name", "region", "gpu_model"), where)
    region = _choice(c["region"], list(region_zone), f"{where}.region", "a region of this file")
    model = _choice(c["gpu_model"], list(models), f"{where}.gpu_model", "a model of this file's gpu_models")
    pue = _number(c.get("pue", 1.2), f"{where}.pue", lo=1.0, hi=3.0)
    weight = _number(c.get("weight", 1.0), f"{where}.weight", positive=True)
    executor = _executor(c.get("executor", {}), f"{where}.executor")
    sampled = [k for k in ("source", "gpus") if k in c]
    declared = [k for k in ("nodes", "node_groups") if k in c]
    if sampled and declared:
        raise ValueError(
            f"{where}: gives both {' + '.join(sampled)} and {' + '.join(declared)}; a cluster's nodes are either "
            "sampled (source + gpus) or declared (nodes / node_groups)"
        )
    if not sampled and not declared:
        raise ValueError(
            f"{where}: has no nodes: declare them (nodes / node_groups) or sample them (source: openb|pai + gpus)"
        )
    common = dict(name=name, region=region, zone=region_zone[region], gpu_model=model, pue=pue, weight=weight)
    if sampled:
        _require(c, ("source", "gpus"), where)
        source = _choice(c["source"], NODE_SOURCES, f"{where}.source", "a node source")
        gpus = _int(c["gpus"], f"{where}.gpus", hi=MAX_SAMPLED_GPUS)
        return ClusterConfig(**common, source=source, gpus=gpus, executor=executor), None, ()
    nodes, drained = _declared_nodes(c, where, name, model)
    config = ClusterConfig(**common, source=DECLARED, gpus=int(nodes["gpu"].sum()), executor=executor)
    return config, nodes, drained


def _declared_nodes(c: dict, where: str, cluster: str, model: str) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """(the node frame (NODE_COLUMNS, as sampled clusters have) of a cluster's `nodes` and `node_groups`, the names
    of those marked `drain: true`)."""
    rows: list[tuple] = []
    drained: list[str] = []
    used: dict[str, str] = {}  # node name -> the entry that declared it

    def add(name: str, shape: tuple[int, int, int], at: str, label: str, drain: bool = False) -> None:
        if name in used:
            raise ValueError(f"{at}: duplicate node name {name!r} (also {used[name]})")
        used[name] = label
        if drain:
            drained.append(name)
        rows.append((name, shape[0], shape[1], shape[2], model))

    if "nodes" in c:
        for k, node in enumerate(_list(c["nodes"], f"{where}.nodes")):
            at = f"{where}.nodes[{k}]"
            node = _mapping(node, at)
            _check_keys(node, NODE_KEYS, at)
            _require(node, ("name", "gpus"), at)
            name = _name(node["name"], f"{at}.name")
            add(name, _shape(node, at, model), f"{at}.name", f"nodes[{k}]", _drain(node, at))
    numbers: dict[str, int] = {}
    if "node_groups" in c:
        for k, group in enumerate(_list(c["node_groups"], f"{where}.node_groups")):
            at = f"{where}.node_groups[{k}]"
            group = _mapping(group, at)
            _check_keys(group, GROUP_KEYS, at)
            _require(group, ("count", "gpus"), at)
            count = _int(group["count"], f"{at}.count", hi=MAX_GROUP_COUNT)
            stem = cluster
            if "name_prefix" in group:
                stem = f"{cluster}-{_name(group['name_prefix'], f'{at}.name_prefix')}"
            shape = _shape(group, at, model)
            drain = _drain(group, at)
            for _ in range(count):
                numbers[stem] = numbers.get(stem, 0) + 1
                add(f"{stem}-{numbers[stem]}", shape, at, f"node_groups[{k}]", drain)
    frame = pd.DataFrame(rows, columns=NODE_COLUMNS)
    return frame.astype({"cpu_milli": np.int64, "memory_mib": np.int64, "gpu": np.int64}), tuple(drained)


def _drain(node: dict, at: str) -> bool:
    """A node's or group's `drain` flag (default false): true or false, nothing else."""
    value = node.get("drain", False)
    if not isinstance(value, bool):
        raise ValueError(f"{at}.drain: must be true or false, got {_show(value)}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: must be a non-empty list, got {_show(value)}")
    return value


def _shape(node: dict, at: str, model: str) -> tuple[int, int, int]:
    """(cpu_milli, memory_mib, gpus) of a declared node or group; its gpu_model, if given, must be the cluster's."""
    if "gpu_model" in node and node["gpu_model"] != model:
        raise ValueError(
            f"{at}.gpu_model: {_show(node['gpu_model'])} differs from the cluster's gpu_model {model!r}; a cluster "
            "holds one GPU model (planning assumes it): declare these nodes in a cluster of their own"
        )
    gpus = _int(node["gpus"], f"{at}.gpus", hi=MAX_NODE_GPUS)
    cpu = _one_of(node, "cpus", "cpu_milli", at)
    if cpu == "cpus":
        cpu_milli = round(_number(node["cpus"], f"{at}.cpus", positive=True, hi=MAX_NODE_CPUS) * 1000)
        if cpu_milli < 1:
            raise ValueError(f"{at}.cpus: must be at least 0.001, got {_show(node['cpus'])}")
    else:
        cpu_milli = _int(node["cpu_milli"], f"{at}.cpu_milli", hi=MAX_NODE_CPUS * 1000)
    mem = _one_of(node, "memory_gib", "memory_mib", at)
    if mem == "memory_gib":
        memory_mib = round(
            _number(node["memory_gib"], f"{at}.memory_gib", positive=True, hi=MAX_NODE_MEMORY_GIB) * 1024
        )
        if memory_mib < 1:
            raise ValueError(f"{at}.memory_gib: must be at least 1 MiB, got {_show(node['memory_gib'])}")
    else:
        memory_mib = _int(node["memory_mib"], f"{at}.memory_mib", hi=MAX_NODE_MEMORY_GIB * 1024)
    return int(cpu_milli), int(memory_mib), gpus


def _one_of(node: dict, a: str, b: str, at: str) -> str:
    if a in node and b in node:
        raise ValueError(f"{at}: give {a} or {b}, not both")
    if a not in node and b not in node:
        raise ValueError(f"{at}: missing key {a!r} (or {b!r})")
    return a if a in node else b


def _executor(value: Any, where: str) -> ExecutorConfig:
    """{kind, ...settings} -> ExecutorConfig; settings are checked for secrets (refused) and *_env names."""
    entry = _mapping(value, where)
    kind = _choice(entry.get("kind", "replay"), EXECUTOR_KINDS, f"{where}.kind", "an executor kind")
    settings = {k: v for k, v in entry.items() if k != "kind"}
    _check_settings(settings, where)
    return ExecutorConfig(kind=kind, settings=copy.deepcopy(settings))


def _check_settings(value: Any, where: str) -> None:
    if isinstance(value, list):
        for k, item in enumerate(value):
            _check_settings(item, f"{where}[{k}]")
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: setting names must be non-empty strings, got {_show(key)}")
        at = f"{where}.{key}"
        lower = key.lower().replace("-", "_")
        if lower.endswith("_env"):
            if not isinstance(item, str) or not ENV_NAME_PATTERN.fullmatch(item):
                raise ValueError(f"{at}: must name an environment variable (letters, digits, _), got {_show(item)}")
        elif not lower.endswith(REFERENCE_SUFFIXES) and any(word in lower for word in SECRET_WORDS):
            raise ValueError(
                f"{at}: looks like a secret, and secrets never go in the fleet file: name an environment variable "
                f"({lower}_env: {lower.upper()}) or an Airflow Connection id "
                "(conn_id: <connection>) instead"
            )
        _check_settings(item, at)
