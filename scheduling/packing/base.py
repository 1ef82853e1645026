"""The packing-policy framework, after the Kubernetes scheduler framework: **filter** the feasible nodes, **score**
them (integer scores, higher is better), **choose** the node (max score; among equal scores the node with the
lowest ``cluster.tiebreak_rank``), then **select the GPU devices** on it (the Reserve step of the FGD reference
simulator). One policy per module under ``scheduling/packing/policies/``; names resolve in ``registry.py``.

"Best fit" device selection, shared by the baselines: a shared pod takes the device with the least free share that
fits (lowest index on ties); whole-GPU pods take the first fully-free devices by index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Self

import numpy as np

from scheduling.packing.cluster import Cluster, Placement
from scheduling.packing.pods import MILLI, Pod
from scheduling.packing.workload import TargetWorkload

MAX_NODE_SCORE = 100
MAX_SPEC_CPU = 128000  # the reference's normalization: 128 cores ...
MAX_SPEC_GPU = 8000  # ... and 8 GPUs per node


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


def sorted_take(free: np.ndarray, pod: Pod) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``free`` sorted ascending, and the mask of the ``num_gpu`` smallest entries that fit the pod."""
    srt = np.sort(free, axis=1)
    lo = (srt < pod.gpu_milli).sum(axis=1)
    pos = np.arange(srt.shape[1])[None, :]
    take = (pos >= lo[:, None]) & (pos < lo[:, None] + pod.num_gpu)
    return srt, take


class PackingPolicy(ABC):
    """Base: the framework steps. Subclasses set ``name`` (the registry key) and ``display_name``, implement
    :meth:`score`, and may override :meth:`filter`, :meth:`select_gpus` and :meth:`create`."""

    name: ClassVar[str] = "base"
    display_name: ClassVar[str] = "Base"

    @classmethod
    def create(cls, workload: TargetWorkload | None = None, seed: int | None = None) -> Self:
        """Factory used by ``make_policy``: each policy takes the options it needs (the baselines none)."""
        return cls()

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
