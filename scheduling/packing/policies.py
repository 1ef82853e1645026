"""Packing policies in the style of the Kubernetes scheduler framework: **filter** the feasible nodes, **score**
them (integer scores, higher is better), choose the node (max score; among equal scores the node with the lowest
``cluster.tiebreak_rank``), then **select the GPU devices** on it (the reference's Reserve step).

Implemented as the reference simulator of FGD (ATC'23) does, scores bit for bit:

=============  ===================================================================  =========================
policy         node score                                                           GPU devices
=============  ===================================================================  =========================
FGD            ``int(sigmoid((F_n - F_n')/1000) * 100)``, F = fragmentation         FGD's own (best score)
BestFit        ``int((1 - 0.5 cpuLeft'/128000 - 0.5 gpuLeft'/8000) * 100)``         best fit
DotProd        ``int(100 (1 - node.pod / 2))``, vectors normalized by 128000/8000   best fit
GpuPacking     prefer shared devices, then used nodes, then idle nodes              best fit
GpuClustering  prefer nodes already running pods of the same GPU-affinity tag       best fit
Random         one feasible node uniformly at random                                random device
=============  ===================================================================  =========================

"Best fit" device selection: a shared pod takes the device with the least free share that fits (lowest index on
ties); whole-GPU pods take the first fully-free devices by index.
"""
from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from scheduling.packing.cluster import Cluster, Placement
from scheduling.packing.frag import frag_tables, node_frag_memo
from scheduling.packing.pods import MILLI, Pod
from scheduling.packing.workload import TargetWorkload

MAX_NODE_SCORE = 100
MAX_SPEC_CPU = 128000
MAX_SPEC_GPU = 8000


def _devices_ascending(free_row: np.ndarray, pod: Pod) -> tuple[int, ...]:
    """The first ``num_gpu`` devices, by ascending free share (stable: lowest index first), that fit the pod."""
    order = np.argsort(free_row, kind="stable")
    picked = [int(i) for i in order if free_row[i] >= pod.gpu_milli][: pod.num_gpu]
    return tuple(picked)


def best_fit_gpus(cluster: Cluster, pod: Pod, node: int) -> tuple[int, ...]:
    """The reference's "best" GPU selection (`allocateGpuIdBasedOnBestFit`)."""
    if not pod.num_gpu:
        return ()
    free = cluster.gpu_free[node, : cluster.gpu_count[node]]
    if pod.is_shared:
        fits = np.flatnonzero(free >= pod.gpu_milli)
        return (int(fits[np.argmin(free[fits])]),) if len(fits) else ()
    if pod.gpu_milli == MILLI:  # AllocateExclusiveGpuId: the first fully-free devices by index
        return tuple(int(i) for i in np.flatnonzero(free == MILLI)[: pod.num_gpu])
    return _devices_ascending(free, pod)  # several partial devices: not in the reference; pack them


def _sorted_take(free: np.ndarray, pod: Pod) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``free`` sorted ascending, and the mask of the ``num_gpu`` smallest entries that fit the pod."""
    srt = np.sort(free, axis=1)
    lo = (srt < pod.gpu_milli).sum(axis=1)
    pos = np.arange(srt.shape[1])[None, :]
    take = (pos >= lo[:, None]) & (pos < lo[:, None] + pod.num_gpu)
    return srt, take


class PackingPolicy(ABC):
    """Base: the framework steps. Subclasses implement :meth:`score` and may override :meth:`filter` and
    :meth:`select_gpus`."""

    name: ClassVar[str] = "base"

    def filter(self, cluster: Cluster, pod: Pod) -> np.ndarray:
        """(N,) bool feasibility mask (CPU, memory, pod count, GPU model, devices with enough free share)."""
        return cluster.feasible(pod)

    @abstractmethod
    def score(self, cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
        """Integer scores (int64, aligned with ``nodes``, higher is better) of the feasible ``nodes``."""

    def select_gpus(self, cluster: Cluster, pod: Pod, node: int) -> tuple[int, ...]:
        return best_fit_gpus(cluster, pod, node)

    def choose(self, cluster: Cluster, pod: Pod, nodes: np.ndarray, scores: np.ndarray) -> int:
        """Max score; ties to the lowest tie-break rank (the reference's lexicographically smallest name)."""
        best = scores.max()
        cand = nodes[scores == best]
        if len(cand) == 1:
            return int(cand[0])
        return int(cand[np.argmin(cluster.tiebreak_rank[cand])])

    def place(self, cluster: Cluster, pod: Pod, exclude: np.ndarray | None = None) -> Placement | None:
        """Where ``pod`` would go now, or None if no node is feasible. Does not change the cluster: call
        ``cluster.allocate(pod, placement)`` to bind it. ``exclude`` (N,) bool: nodes held for another pod
        (a reservation), filtered out like infeasible ones."""
        ok = self.filter(cluster, pod)
        if exclude is not None:
            ok = ok & ~exclude
        nodes = np.flatnonzero(ok)
        if len(nodes) == 0:
            return None
        if len(nodes) == 1:  # the framework skips scoring when a single node passes the filters
            node, score = int(nodes[0]), None
        else:
            scores = self.score(cluster, pod, nodes)
            node = self.choose(cluster, pod, nodes, scores)
            score = int(scores[np.searchsorted(nodes, node)])
        return Placement(node, cluster.names[node], self.select_gpus(cluster, pod, node), score)

    def schedule(self, cluster: Cluster, pod: Pod) -> Placement | None:
        """:meth:`place` then allocate; returns the placement, or None (the pod is not bound)."""
        placement = self.place(cluster, pod)
        if placement is not None:
            cluster.allocate(pod, placement)
        return placement

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BestFit(PackingPolicy):
    """`best_fit_score.go`: least CPU and GPU left after placement (weights 0.5/0.5 over 128 cores / 8 GPUs).
    The reference min-max normalizes the scores over the nodes; that keeps their order, so it is skipped."""

    name = "bestfit"

    def score(self, cluster, pod, nodes):
        cpu_left = cluster.cpu_free[nodes]
        gpu_left = cluster.gpu_free[nodes].sum(axis=1)
        s = (cpu_left - pod.cpu_milli).astype(np.float64) / MAX_SPEC_CPU * 0.5
        s = s + (gpu_left - pod.total_gpu_milli).astype(np.float64) / MAX_SPEC_GPU * 0.5
        return ((1.0 - s) * MAX_NODE_SCORE).astype(np.int64)


class DotProd(PackingPolicy):
    """`dot_product_score.go` with ``-dimext merge -norm max``: node [cpuLeft, gpuLeft] and pod [cpu, gpu]
    normalized by (128000, 8000); the smaller the dot product, the higher the score."""

    name = "dotprod"

    def score(self, cluster, pod, nodes):
        a0 = cluster.cpu_free[nodes].astype(np.float64) / MAX_SPEC_CPU
        a1 = cluster.gpu_free[nodes].sum(axis=1).astype(np.float64) / MAX_SPEC_GPU
        b0 = float(pod.cpu_milli) / MAX_SPEC_CPU
        b1 = float(pod.total_gpu_milli) / MAX_SPEC_GPU
        dot = (0.0 + a0 * b0) + a1 * b1
        return (MAX_NODE_SCORE * (1 - dot / 2.0)).astype(np.int64)


class GpuPacking(PackingPolicy):
    """`gpu_packing_score.go`: shared devices first (100 - free share on the used devices / 10, at least 50),
    then fully-free devices of a used node (50 - devices used, at least 33), then idle nodes
    (max(33 - devices, devices)). CPU-only pods score 0 everywhere."""

    name = "gpupacking"

    def score(self, cluster, pod, nodes):
        if pod.gpu_milli <= 0:
            return np.zeros(len(nodes), dtype=np.int64)
        n_full = cluster.gpu_full[nodes]
        idle_node = n_full == cluster.gpu_count[nodes]
        if pod.gpu_milli == MILLI:  # whole devices: always fully-free ones
            full_used = np.full(len(nodes), pod.num_gpu)
            ratio = np.zeros(len(nodes), dtype=np.int64)
        elif pod.num_gpu == 1:  # the least free device that fits
            free = cluster.gpu_free[nodes]
            least = np.where(free >= pod.gpu_milli, free, MILLI + 1).min(axis=1)
            full_used = (least == MILLI).astype(np.int64)
            ratio = least * 100 // MILLI
        else:
            srt, take = _sorted_take(cluster.gpu_free[nodes], pod)
            full_used = (take & (srt == MILLI)).sum(axis=1)
            ratio = np.where(take, srt * 100 // MILLI, 0).sum(axis=1)
        case1 = np.maximum(MAX_NODE_SCORE - ratio // 10, MAX_NODE_SCORE // 2)
        case2 = np.maximum(MAX_NODE_SCORE // 2 - full_used, MAX_NODE_SCORE // 3)
        case3 = np.maximum(MAX_NODE_SCORE // 3 - n_full, n_full)
        return np.where(idle_node, case3, np.where(full_used > 0, case2, case1)).astype(np.int64)


class GpuClustering(PackingPolicy):
    """`gpu_clustering_score.go`: pods with the same affinity tag ("share-gpu" or "<k>-gpu") together.
    ``base = 25 * (8000 - gpuLeft) // 8000`` plus 75 (only the pod's tag on the node), 50 (the pod's tag among
    others), 25 (no tags) or 0 (other tags only). CPU-only pods score 0."""

    name = "gpuclustering"

    def score(self, cluster, pod, nodes):
        if not pod.num_gpu:
            return np.zeros(len(nodes), dtype=np.int64)
        col = 0 if pod.is_shared else pod.num_gpu
        tags = cluster.tag_count[nodes]
        n_tags = (tags > 0).sum(axis=1)
        same = tags[:, col] > 0 if col < tags.shape[1] else np.zeros(len(nodes), dtype=bool)
        base = (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU - cluster.gpu_free[nodes].sum(axis=1)) // MAX_SPEC_GPU
        bonus = np.where(same, np.where(n_tags == 1, 75, 50), np.where(n_tags == 0, 25, 0))
        return (base + bonus).astype(np.int64)


class RandomFit(PackingPolicy):
    """`random_score.go`: a feasible node uniformly at random; a shared pod gets a random fitting device
    (reservoir sampling in the reference), whole-GPU pods the first fully-free devices. The reference's draws
    come from Go's global math/rand and cannot be replayed; this uses ``numpy.random.default_rng(seed)``."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def score(self, cluster, pod, nodes):
        out = np.zeros(len(nodes), dtype=np.int64)
        out[self.rng.integers(len(nodes))] = MAX_NODE_SCORE
        return out

    def select_gpus(self, cluster, pod, node):
        if pod.is_shared:
            fits = np.flatnonzero(cluster.gpu_free[node, : cluster.gpu_count[node]] >= pod.gpu_milli)
            return (int(fits[self.rng.integers(len(fits))]),)
        return best_fit_gpus(cluster, pod, node)


class _FgdClassCache:
    __slots__ = ("score", "gpu", "version")

    def __init__(self, n: int):
        self.score = np.zeros(n, dtype=np.int64)
        self.gpu = np.full(n, -1, dtype=np.int64)
        self.version = np.full(n, -1, dtype=np.int64)


class _FgdState:
    __slots__ = ("tables", "classes")

    def __init__(self, cluster: Cluster, workload: TargetWorkload):
        self.tables = frag_tables(workload, cluster.model_names)
        self.classes: dict[tuple[int, int, int], _FgdClassCache] = {}


_EARLIER = np.tri(64, 64, -1, dtype=bool)  # _EARLIER[i, j]: device j comes before device i


_ROW_HASH = np.random.default_rng(20230710).integers(1, 2**62, size=64) | 1  # odd 64-bit multipliers


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first of each distinct row and, per row, its distinct row: ``rows[first][inverse] ==
    rows``. Rows are hashed (wrapping int64 arithmetic) and the result verified; on a hash collision every row
    counts as distinct."""
    h = rows.astype(np.int64) @ _ROW_HASH[: rows.shape[1]]
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    if not (rows[first][inverse] == rows).all():
        n = len(rows)
        return np.arange(n), np.arange(n)
    return first, inverse


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """``int64(sigmoid(delta / 1000) * 100)`` with ``delta = F_before - F_after`` (milli-GPU)."""
    x = np.asarray(delta, dtype=np.float64) / 1000.0
    return (1.0 / (1.0 + np.exp(-x)) * float(MAX_NODE_SCORE)).astype(np.int64)


class FGD(PackingPolicy):
    """Fragmentation Gradient Descent (`fgd_score.go`): the node (and, for a shared pod, the device) whose
    fragmentation grows least, scored ``int(sigmoid((F_before - F_after)/1000) * 100)``.

    Whole-GPU, multi-GPU and CPU-only pods are evaluated after taking the fitting devices with the least free
    share; their devices are the first fully-free ones by index. A shared pod tries each fitting device in index
    order and keeps the first with the best score.

    Scores are memoized per (node, pod shape): a node's score for a pod shape only changes when the node does
    (``cluster.version``), so each decision only rescores the nodes changed since that shape was last seen.
    The cache is kept per cluster (weakly), so one policy object can serve several clusters.
    """

    name = "fgd"
    MAX_CACHED_SHAPES = 512

    def __init__(self, workload: TargetWorkload):
        self.workload = workload
        self._states: weakref.WeakKeyDictionary[Cluster, _FgdState] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"FGD(workload={len(self.workload)} typical pods)"

    def _state(self, cluster: Cluster) -> _FgdState:
        st = self._states.get(cluster)
        if st is None:
            st = _FgdState(cluster, self.workload)
            self._states[cluster] = st
        return st

    def _class_cache(self, st: _FgdState, cluster: Cluster, pod: Pod) -> _FgdClassCache:
        cache = st.classes.get(pod.score_key)
        if cache is None:
            if len(st.classes) >= self.MAX_CACHED_SHAPES:
                st.classes.pop(next(iter(st.classes)))
            cache = _FgdClassCache(cluster.n_nodes)
            st.classes[pod.score_key] = cache
        return cache

    def _compute(self, cluster: Cluster, st: _FgdState, pod: Pod, nodes: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """FGD scores (and, for shared pods, the device) of ``nodes`` computed afresh."""
        f_now = cluster.node_fragmentation(self.workload)[nodes]
        cpu_after = cluster.cpu_free[nodes] - pod.cpu_milli
        free = cluster.gpu_free[nodes]
        model = cluster.model_id[nodes]
        if pod.is_shared:
            # devices with the same free share give the same node state: try only the first of each value
            # (the reference keeps the first device among equal scores, so the result is the same)
            G = free.shape[1]
            twin = ((free[:, :, None] == free[:, None, :]) & _EARLIER[:G, :G]).any(axis=2)
            rows, cols = np.nonzero((free >= pod.gpu_milli) & ~twin)
            hypo = free[rows]
            hypo[np.arange(len(rows)), cols] -= pod.gpu_milli
            f_after = node_frag_memo(cpu_after[rows], hypo, model[rows], st.tables)
            per_dev = np.full(free.shape, -1, dtype=np.int64)
            per_dev[rows, cols] = sigmoid_score(f_now[rows] - f_after)
            gpu = per_dev.argmax(axis=1)  # first device with the best score
            return per_dev[np.arange(len(nodes)), gpu], gpu
        if pod.num_gpu:
            srt, take = _sorted_take(free, pod)
            hypo = srt - np.where(take, pod.gpu_milli, 0)
        else:
            hypo = free
        f_after = node_frag_memo(cpu_after, hypo, model, st.tables)
        return sigmoid_score(f_now - f_after), np.full(len(nodes), -1, dtype=np.int64)

    def score(self, cluster, pod, nodes):
        st = self._state(cluster)
        cache = self._class_cache(st, cluster, pod)
        ver = cluster.version[nodes]
        stale = nodes[cache.version[nodes] != ver]
        if len(stale) > 32:  # many nodes (a pod shape not seen for a while): score each distinct state once
            first, inverse = _distinct_rows(np.column_stack(
                (cluster.cpu_free[stale], cluster.model_id[stale], cluster.gpu_free[stale])))
            s, g = self._compute(cluster, st, pod, stale[first])
            s, g = s[inverse], g[inverse]
            cache.score[stale] = s
            cache.gpu[stale] = g
            cache.version[stale] = cluster.version[stale]
        elif len(stale):
            s, g = self._compute(cluster, st, pod, stale)
            cache.score[stale] = s
            cache.gpu[stale] = g
            cache.version[stale] = cluster.version[stale]
        return cache.score[nodes]

    def select_gpus(self, cluster, pod, node):
        if not pod.num_gpu:
            return ()
        if pod.is_shared:
            st = self._state(cluster)
            cache = self._class_cache(st, cluster, pod)
            if cache.version[node] != cluster.version[node]:
                self.score(cluster, pod, np.array([node]))
            return (int(cache.gpu[node]),)
        return best_fit_gpus(cluster, pod, node)


POLICY_NAMES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
DISPLAY_NAMES = {"random": "Random", "dotprod": "DotProd", "gpuclustering": "GpuClustering",
                 "gpupacking": "GpuPacking", "bestfit": "BestFit", "fgd": "FGD"}


def make_policy(name: str, workload: TargetWorkload | None = None, seed: int | None = None) -> PackingPolicy:
    """A policy by name (case-insensitive; see ``POLICY_NAMES``). FGD needs the target ``workload``; Random
    takes a ``seed``."""
    key = name.lower().replace("-", "").replace("_", "")
    if key == "fgd":
        if workload is None:
            raise ValueError("FGD needs the target workload (TargetWorkload.from_pods(...))")
        return FGD(workload)
    if key == "random":
        return RandomFit(seed)
    classes = {"bestfit": BestFit, "dotprod": DotProd, "gpupacking": GpuPacking, "gpuclustering": GpuClustering}
    if key not in classes:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return classes[key]()
