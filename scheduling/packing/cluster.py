"""Cluster model: nodes with CPU, memory and per-device free milli-GPU, pods bound to nodes and devices.

State lives in numpy arrays (one row per node) so that policies can filter and score all nodes at once. Every
change to a node bumps ``version[node]``; policies and the fragmentation cache compare versions to know which
nodes to recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduling.packing.frag import frag_tables, node_frag_memo
from scheduling.packing.pods import MILLI, Pod
from scheduling.packing.workload import TargetWorkload

DEFAULT_MAX_PODS = 1001  # the reference's `pods` allocatable per node


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod goes: node index (row in the cluster), its name, the GPU device indices, and the score
    that won (None when the policy did not score, e.g. only one feasible node)."""

    node: int
    node_name: str
    gpus: tuple[int, ...] = ()
    score: int | None = None


@dataclass(frozen=True, slots=True)
class Binding:
    pod: Pod
    node: int
    gpus: tuple[int, ...]


class Cluster:
    """Nodes and their free resources; pods bound to them.

    Arrays (read them, never write them; use :meth:`allocate` / :meth:`release`):
    ``cpu_capacity``, ``cpu_free`` (milli-cores), ``mem_capacity``, ``mem_free`` (MiB), ``gpu_count``,
    ``gpu_free`` (N x G milli-GPU per device, absent devices 0), ``model_id`` (index into ``model_names``; ""
    for nodes without GPUs), ``pod_count``, ``max_pods``, ``tiebreak_rank`` (lower wins among equal scores),
    ``version``, ``tag_count`` (N x (G+1): column 0 counts shared-GPU pods, column k whole-GPU pods of k
    devices; GpuClustering's affinity tags).
    """

    def __init__(
        self, names, cpu_milli, memory_mib, gpu_count, gpu_model, tiebreak_rank=None, max_pods=DEFAULT_MAX_PODS
    ):
        self.names = [str(n) for n in names]
        n = len(self.names)
        if len(set(self.names)) != n:
            raise ValueError("node names must be unique")
        self.cpu_capacity = np.asarray(cpu_milli, dtype=np.int64).copy()
        self.mem_capacity = np.asarray(memory_mib, dtype=np.int64).copy()
        self.gpu_count = np.asarray(gpu_count, dtype=np.int64).copy()
        models = [
            "" if (m is None or (isinstance(m, float) and m != m) or not self.gpu_count[i]) else str(m)
            for i, m in enumerate(gpu_model)
        ]
        for arr, what in ((self.cpu_capacity, "cpu_milli"), (self.mem_capacity, "memory_mib"), (self.gpu_count, "gpu")):
            if arr.shape != (n,):
                raise ValueError(f"{what}: expected {n} values, got shape {arr.shape}")
            bad = np.flatnonzero(arr < 0)
            if len(bad):
                raise ValueError(f"node {self.names[bad[0]]!r}: negative {what} ({arr[bad[0]]})")
        self.model_names: tuple[str, ...] = tuple(sorted(set(models)))
        index = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([index[m] for m in models], dtype=np.int64)
        self.n_gpu_slots = max(1, int(self.gpu_count.max()) if n else 1)
        G = self.n_gpu_slots
        self.gpu_exists = np.arange(G)[None, :] < self.gpu_count[:, None]
        self.gpu_free = np.where(self.gpu_exists, MILLI, 0).astype(np.int64)
        self.gpu_free_max = self.gpu_free.max(axis=1)  # largest free share on a device, per node
        self.gpu_full = (self.gpu_free == MILLI).sum(axis=1)  # fully-free devices, per node
        self.cpu_free = self.cpu_capacity.copy()
        self.mem_free = self.mem_capacity.copy()
        self.pod_count = np.zeros(n, dtype=np.int64)
        self.max_pods = np.broadcast_to(np.asarray(max_pods, dtype=np.int64), (n,)).copy()
        rank = np.arange(n) if tiebreak_rank is None else np.asarray(tiebreak_rank, dtype=np.int64)
        if rank.shape != (n,) or len(np.unique(rank)) != n:
            raise ValueError("tiebreak_rank must give each node a distinct rank")
        self.tiebreak_rank = rank.copy()
        self.rank_order = np.argsort(rank, kind="stable")  # node indices, best tie-break first
        self.version = np.zeros(n, dtype=np.int64)
        self.tag_count = np.zeros((n, G + 1), dtype=np.int64)
        self.bindings: dict[str, Binding] = {}
        self.gpu_milli_allocated = 0
        self.gpu_milli_capacity = int(self.gpu_count.sum()) * MILLI
        self._index = {name: i for i, name in enumerate(self.names)}
        self._frag_cache: dict[int, tuple] = {}
        self._model_mask_cache: dict[str, np.ndarray] = {}

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_nodes(cls, nodes, tiebreak_rank=None, max_pods=DEFAULT_MAX_PODS) -> Cluster:
        """From a DataFrame with the openb node-list columns: ``sn`` (or ``name``), ``cpu_milli``,
        ``memory_mib``, ``gpu``, ``model``; an optional ``tiebreak_rank`` column (or argument: array aligned
        with the rows, or a mapping name -> rank) sets the node priority among equal scores."""
        name_col = "sn" if "sn" in nodes.columns else "name"
        for col in (name_col, "cpu_milli", "memory_mib", "gpu", "model"):
            if col not in nodes.columns:
                raise ValueError(f"node list lacks column {col!r}")
        names = nodes[name_col].astype(str).tolist()
        if tiebreak_rank is None and "tiebreak_rank" in nodes.columns:
            tiebreak_rank = nodes["tiebreak_rank"].to_numpy()
        elif isinstance(tiebreak_rank, dict):
            tiebreak_rank = [tiebreak_rank[n] for n in names]
        models = [None if (isinstance(m, float) and m != m) else m for m in nodes["model"].tolist()]
        return cls(
            names,
            nodes["cpu_milli"].to_numpy(),
            nodes["memory_mib"].to_numpy(),
            nodes["gpu"].to_numpy(),
            models,
            tiebreak_rank=tiebreak_rank,
            max_pods=max_pods,
        )

    def copy(self) -> Cluster:
        """An independent copy (same nodes, pods and tie-break order); policies' caches start afresh for it."""
        new = object.__new__(Cluster)
        new.__dict__.update(self.__dict__)
        for name in (
            "gpu_free",
            "gpu_free_max",
            "gpu_full",
            "cpu_free",
            "mem_free",
            "pod_count",
            "version",
            "tag_count",
        ):
            setattr(new, name, getattr(self, name).copy())
        new.bindings = dict(self.bindings)
        # the fragmentation caches carry over (copied): a what-if copy does not recompute every node
        new._frag_cache = {
            key: (wl, tables, values.copy(), seen.copy())
            for key, (wl, tables, values, seen) in self._frag_cache.items()
        }
        return new

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.names)

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    def node_index(self, name: str) -> int:
        return self._index[name]

    def gpu_free_total(self) -> np.ndarray:
        """Free milli-GPU per node (N,)."""
        return self.gpu_free.sum(axis=1)

    @property
    def gpu_milli_idle(self) -> int:
        return self.gpu_milli_capacity - self.gpu_milli_allocated

    def model_mask(self, pod: Pod) -> np.ndarray:
        """(n_models,) bool: GPU models the pod may use (all for CPU-only or unconstrained pods)."""
        mask = self._model_mask_cache.get(pod.gpu_spec)
        if mask is None:
            mask = np.array([pod.allows_model(m) for m in self.model_names], dtype=bool)
            self._model_mask_cache[pod.gpu_spec] = mask
        return mask

    def feasible(self, pod: Pod) -> np.ndarray:
        """(N,) bool: the reference's filters. NodeResourcesFit: CPU, memory, pod count. Open-Gpu-Share, for
        GPU pods: a GPU node of an allowed model with ``num_gpu`` devices each having ``gpu_milli`` free."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib) & (self.pod_count < self.max_pods)
        if pod.num_gpu:
            ok &= self.gpu_count > 0
            if pod.gpu_models:
                ok &= self.model_mask(pod)[self.model_id]
            if pod.num_gpu == 1:
                ok &= self.gpu_free_max >= pod.gpu_milli
            elif pod.gpu_milli == MILLI:
                ok &= self.gpu_full >= pod.num_gpu
            else:
                ok &= (self.gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return ok

    def can_host(self, pod: Pod, node: int, gpus: tuple[int, ...] | None = None) -> bool:
        """Whether ``pod`` fits on ``node`` (on the given devices, if any)."""
        if not (
            self.cpu_free[node] >= pod.cpu_milli
            and self.mem_free[node] >= pod.memory_mib
            and self.pod_count[node] < self.max_pods[node]
        ):
            return False
        if not pod.num_gpu:
            return not gpus
        if self.gpu_count[node] == 0 or not pod.allows_model(self.model_names[self.model_id[node]]):
            return False
        if gpus is None:
            return int((self.gpu_free[node] >= pod.gpu_milli).sum()) >= pod.num_gpu
        return (
            len(gpus) == pod.num_gpu
            and len(set(gpus)) == len(gpus)
            and all(0 <= g < self.gpu_count[node] and self.gpu_free[node, g] >= pod.gpu_milli for g in gpus)
        )

    # ----------------------------------------------------------------- changes
    def allocate(self, pod: Pod, placement: Placement | int, gpus: tuple[int, ...] | None = None) -> Binding:
        """Bind ``pod`` to the placement's node and devices (raises ValueError if it does not fit or the pod id
        is already bound)."""
        if isinstance(placement, Placement):
            node, gpus = placement.node, placement.gpus
        else:
            node, gpus = int(placement), tuple(gpus or ())
        if pod.pod_id in self.bindings:
            raise ValueError(f"pod {pod.pod_id!r} is already bound")
        gpus = tuple(int(g) for g in gpus)
        if not self.can_host(pod, node, gpus):
            raise ValueError(f"pod {pod.pod_id!r} does not fit on node {self.names[node]!r} (GPUs {gpus})")
        self.cpu_free[node] -= pod.cpu_milli
        self.mem_free[node] -= pod.memory_mib
        self.pod_count[node] += 1
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
        self._refresh_gpu_summary(node)
        if pod.num_gpu:
            self.tag_count[node, 0 if pod.is_shared else pod.num_gpu] += 1
        self.gpu_milli_allocated += pod.total_gpu_milli
        self.version[node] += 1
        binding = Binding(pod, node, gpus)
        self.bindings[pod.pod_id] = binding
        return binding

    def release(self, pod_id: str) -> Binding:
        """Unbind a pod and give its resources back (KeyError if unknown)."""
        binding = self.bindings.pop(pod_id)
        pod, node = binding.pod, binding.node
        self.cpu_free[node] += pod.cpu_milli
        self.mem_free[node] += pod.memory_mib
        self.pod_count[node] -= 1
        for g in binding.gpus:
            self.gpu_free[node, g] += pod.gpu_milli
        self._refresh_gpu_summary(node)
        if pod.num_gpu:
            self.tag_count[node, 0 if pod.is_shared else pod.num_gpu] -= 1
        self.gpu_milli_allocated -= pod.total_gpu_milli
        self.version[node] += 1
        return binding

    def _refresh_gpu_summary(self, node: int) -> None:
        row = self.gpu_free[node]
        self.gpu_free_max[node] = row.max()
        self.gpu_full[node] = int((row == MILLI).sum())

    # ----------------------------------------------------------------- fragmentation
    def node_fragmentation(self, workload: TargetWorkload) -> np.ndarray:
        """F_n(M) per node (milli-GPU, float64), memoized per workload and recomputed only for changed nodes
        (through the workload's state memo). The returned array is the cache: do not modify it."""
        entry = self._frag_cache.get(id(workload))
        if entry is None or entry[0] is not workload:
            tables = frag_tables(workload, self.model_names)
            values = node_frag_memo(self.cpu_free, self.gpu_free, self.model_id, tables)
            self._frag_cache[id(workload)] = (workload, tables, values, self.version.copy())
            return values
        _, tables, values, seen = entry
        stale = np.flatnonzero(seen != self.version)
        if len(stale):
            values[stale] = node_frag_memo(self.cpu_free[stale], self.gpu_free[stale], self.model_id[stale], tables)
            seen[stale] = self.version[stale]
        return values

    def fragmentation(self, workload: TargetWorkload) -> float:
        """Cluster fragmentation F = sum_n F_n(M), in milli-GPU. Divide by :attr:`gpu_milli_idle` for the
        fragmentation ratio, or by ``1000 * total_gpus`` for the amount as a share of the cluster."""
        return float(self.node_fragmentation(workload).sum())

    def __repr__(self) -> str:
        return (
            f"Cluster({self.n_nodes} nodes, {self.total_gpus} GPUs, {len(self.bindings)} pods, "
            f"{self.gpu_milli_allocated}/{self.gpu_milli_capacity} GPU-milli allocated)"
        )
