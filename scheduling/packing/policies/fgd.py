"""FGD, Fragmentation Gradient Descent (the reference's `fgd_score.go`): the node, and for a shared pod the device,
whose GPU fragmentation against the target workload grows least.

Node score: ``int(sigmoid((F_n - F_n') / 1000) * 100)``, where ``F_n`` is the node's fragmentation now and ``F_n'``
after placing the pod (milli-GPU, see ``frag.py``). Whole-GPU, multi-GPU and CPU-only pods are evaluated after
taking the fitting devices with the least free share.

GPU devices: a shared pod tries each fitting device in index order and keeps the first with the best score (FGD's
own selection); whole-GPU pods take the first fully-free devices by index (``best_fit_gpus``).

Scores are memoized per (node, pod shape): a node's score for a pod shape only changes when the node does
(``cluster.version``), so each decision rescores only the nodes changed since that shape was last seen.
"""

from __future__ import annotations

import weakref

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, PackingPolicy, best_fit_gpus, sorted_take
from scheduling.packing.cluster import Cluster
from scheduling.packing.frag import frag_tables, node_frag_memo
from scheduling.packing.pods import Pod
from scheduling.packing.workload import TargetWorkload

_EARLIER = np.tri(64, 64, -1, dtype=bool)  # _EARLIER[i, j]: device j comes before device i
_ROW_HASH = np.random.default_rng(20230710).integers(1, 2**62, size=64) | 1  # odd 64-bit multipliers


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """``int64(sigmoid(delta / 1000) * 100)`` with ``delta = F_before - F_after`` (milli-GPU)."""
    x = np.asarray(delta, dtype=np.float64) / 1000.0
    return (1.0 / (1.0 + np.exp(-x)) * float(MAX_NODE_SCORE)).astype(np.int64)


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


class _FgdClassCache:
    """One pod shape's memo: per node, the score, the chosen device (shared pods) and the node version seen."""

    __slots__ = ("score", "gpu", "version")

    def __init__(self, n: int):
        self.score = np.zeros(n, dtype=np.int64)
        self.gpu = np.full(n, -1, dtype=np.int64)
        self.version = np.full(n, -1, dtype=np.int64)


class _FgdState:
    """One cluster's FGD state: the workload's fragmentation tables for its GPU models, and the shape memos."""

    __slots__ = ("tables", "classes")

    def __init__(self, cluster: Cluster, workload: TargetWorkload):
        self.tables = frag_tables(workload, cluster.model_names)
        self.classes: dict[tuple[int, int, int], _FgdClassCache] = {}


class FGD(PackingPolicy):
    """Least growth of fragmentation; needs the target workload. The caches are kept per cluster (weakly), so one
    policy object can serve several clusters."""

    name = "fgd"
    display_name = "FGD"
    MAX_CACHED_SHAPES = 512

    def __init__(self, workload: TargetWorkload):
        self.workload = workload
        self._states: weakref.WeakKeyDictionary[Cluster, _FgdState] = weakref.WeakKeyDictionary()

    @classmethod
    def create(cls, workload: TargetWorkload | None = None, seed: int | None = None) -> FGD:
        if workload is None:
            raise ValueError("FGD needs the target workload (TargetWorkload.from_pods(...))")
        return cls(workload)

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

    def _compute(self, cluster: Cluster, st: _FgdState, pod: Pod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
            srt, take = sorted_take(free, pod)
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
            first, inverse = _distinct_rows(
                np.column_stack((cluster.cpu_free[stale], cluster.model_id[stale], cluster.gpu_free[stale]))
            )
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
