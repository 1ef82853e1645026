"""Fleet configuration: GPU clusters in regions, each region mapped to a grid zone (see `scheduling/domain/fleet.yaml`).

A cluster holds nodes of one GPU model, sampled (seeded) from the openb node list or the Alibaba PAI 2020 machine
specs, plus its PUE; GPU models carry idle/peak board power, a speed source (Gavel type or a relative speed) and
the Zeus power profile that yields their power-limit options.

    from scheduling.domain.fleet import load_fleet
    fleet = load_fleet()                          # scheduling/domain/fleet.yaml, nodes from DATA_DIR
    fleet = load_fleet(regions=6)                 # the first six regions (or a list of region names / zones)
    fleet = fleet.scaled(total_gpus=96)           # re-size in proportion to the clusters' weights
    fleet.capacity_milli                          # (C,) GPU-milli per cluster
    fleet.packing_cluster(0)                      # a fresh scheduling.packing.Cluster of cluster 0's nodes
    fleet.capacity_table()                        # region, zone, cluster, model, nodes, gpus, pue

Node counts are whole nodes: a cluster gets nodes until it reaches its GPU target (at least one node).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from scheduling.domain.gpus import map_gpu_type
from scheduling.packing import Cluster
from warehouse.config import data_dir as configured

DEFAULT_FLEET_PATH = Path(__file__).with_name("fleet.yaml")
OPENB_NODES = Path("openb") / "openb_node_list_gpu_node.csv"
PAI_NODES = Path("interference") / "cluster_specs" / "alibaba_pai2020_machine_spec.csv"
NODE_SOURCES = ("openb", "pai")


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
class ClusterConfig:
    name: str
    region: str
    zone: str
    gpu_model: str
    source: str = "openb"
    gpus: int = 64
    pue: float = 1.2
    weight: float = 1.0


@dataclass
class FleetCluster:
    config: ClusterConfig
    nodes: pd.DataFrame  # sn, cpu_milli, memory_mib, gpu, model

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def n_gpus(self) -> int:
        return int(self.nodes["gpu"].sum())

    @property
    def capacity_milli(self) -> int:
        return self.n_gpus * 1000

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

    def scaled(self, total_gpus: float, seed: int | None = None) -> Fleet:
        """The same clusters re-sized so that the fleet has about `total_gpus` GPUs, split by weight (each
        cluster at least one node)."""
        weights = np.array([c.config.weight for c in self.clusters], dtype=float)
        targets = total_gpus * weights / weights.sum()
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
                }
            )
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ node pools
    def _pool(self, source: str, model: str) -> pd.DataFrame:
        key = (source, model)
        if key not in self._pools:
            self._pools[key] = node_pool(source, model)
        return self._pools[key]

    def _sample_nodes(self, cfg: ClusterConfig, seed: int | None = None) -> pd.DataFrame:
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
    return pd.DataFrame(rows, columns=["sn", "cpu_milli", "memory_mib", "gpu", "model"])


def _stable_hash(text: str) -> int:
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def load_fleet(
    path: str | Path | None = None, regions: int | Iterable[str] | None = None, data_dir=None, seed: int | None = None
) -> Fleet:
    """Read the fleet YAML (default scheduling/domain/fleet.yaml) and sample every cluster's nodes."""
    path = Path(path) if path else DEFAULT_FLEET_PATH
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: not a mapping")
    for key in ("regions", "gpu_models", "clusters"):
        if key not in spec:
            raise ValueError(f"{path}: missing section {key!r}")
    region_zone = {}
    for name, entry in spec["regions"].items():
        if not isinstance(entry, dict) or "zone" not in entry:
            raise ValueError(f"{path}: region {name!r} needs a zone")
        region_zone[str(name)] = str(entry["zone"])
    models = {}
    for name, m in spec["gpu_models"].items():
        try:
            if "power_profile" in m:  # the curve mapping has one home (scheduling/domain/gpus.py GPU_MAP)
                raise ValueError(
                    "power_profile is not read from the fleet file; the GPU -> power-curve mapping "
                    "is scheduling.domain.gpus.GPU_MAP"
                )
            models[str(name)] = GpuModel(
                name=str(name),
                idle_w=float(m["idle_w"]),
                peak_w=float(m["peak_w"]),
                gavel=m.get("gavel"),
                relative_speed=m.get("relative_speed"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: gpu_models.{name}: {exc}") from exc
        if models[name].gavel is None and models[name].relative_speed is None:
            raise ValueError(f"{path}: gpu_models.{name}: needs gavel or relative_speed")
    fleet_seed = int(spec.get("seed", 7) if seed is None else seed)
    fleet = Fleet(
        clusters=[],
        gpu_models=models,
        regions=region_zone,
        transfer_kwh_per_gb=float(spec.get("transfer", {}).get("kwh_per_gb", 0.0075)),
        seed=fleet_seed,
        source_path=str(path),
    )
    names = set()
    configs = []
    for i, c in enumerate(spec["clusters"]):
        where = f"{path}: clusters[{i}]"
        for key in ("name", "region", "gpu_model"):
            if key not in c:
                raise ValueError(f"{where}: missing {key!r}")
        if c["name"] in names:
            raise ValueError(f"{where}: duplicate cluster name {c['name']!r}")
        names.add(c["name"])
        if c["region"] not in region_zone:
            raise ValueError(f"{where}: region {c['region']!r} not in regions")
        if c["gpu_model"] not in models:
            raise ValueError(f"{where}: gpu_model {c['gpu_model']!r} not in gpu_models")
        source = c.get("source", "openb")
        if source not in NODE_SOURCES:
            raise ValueError(f"{where}: source {source!r} not one of {NODE_SOURCES}")
        pue = float(c.get("pue", 1.2))
        if not 1.0 <= pue <= 3.0:
            raise ValueError(f"{where}: pue {pue} outside [1, 3]")
        configs.append(
            ClusterConfig(
                name=str(c["name"]),
                region=str(c["region"]),
                zone=region_zone[c["region"]],
                gpu_model=str(c["gpu_model"]),
                source=source,
                gpus=int(c.get("gpus", 64)),
                pue=pue,
                weight=float(c.get("weight", 1.0)),
            )
        )
    root = _data_dir(data_dir)
    for cfg in configs:
        key = (cfg.source, cfg.gpu_model)
        if key not in fleet._pools:
            fleet._pools[key] = node_pool(cfg.source, cfg.gpu_model, root)
    fleet.clusters = [FleetCluster(cfg, fleet._sample_nodes(cfg)) for cfg in configs]
    return fleet.select(regions)
