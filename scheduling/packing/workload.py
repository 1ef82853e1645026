"""The target workload M ("typical pods") that the fragmentation measure is taken against.

As the reference (`GetTypicalPods`, `pkg/utils/frag.go`): pods are keyed by (CPU milli, per-GPU milli, GPU
count, GPU model list); keys are sorted by count, descending, ties putting the larger key first; keys are kept one
at a time until their cumulative count reaches the popularity threshold (95 %); the kept frequencies are then
renormalized, in float64 exactly as the reference does (``p = (count/total) / (cum/total)``) so that FGD's
integer scores are bit-exact. CPU-only pods are included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduling.packing.pods import Pod


@dataclass(frozen=True, eq=False)
class TargetWorkload:
    """Typical pods with their weights (sum 1). Arrays are aligned: ``cpu[m]``, ``gpu_milli[m]``,
    ``num_gpu[m]``, ``gpu_spec[m]``, ``weight[m]``. ``coverage`` is the share of pods the kept keys cover."""

    cpu: np.ndarray
    gpu_milli: np.ndarray
    num_gpu: np.ndarray
    gpu_spec: tuple[str, ...]
    weight: np.ndarray
    coverage: float = 1.0
    n_keys_total: int = 0
    _access_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("cpu", "gpu_milli", "num_gpu", "weight"):
            arr = np.asarray(getattr(self, name))
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    def __len__(self) -> int:
        return len(self.weight)

    @classmethod
    def from_pods(
        cls, pods: Iterable[Pod], popularity_threshold: float = 95, include_cpu_pods: bool = True
    ) -> TargetWorkload:
        counts: Counter = Counter()
        for pod in pods:
            if not include_cpu_pods and pod.num_gpu == 0:
                continue
            counts[(pod.cpu_milli, pod.gpu_milli, pod.num_gpu, pod.gpu_spec)] += 1
        if not counts:
            raise ValueError("no pods to derive the target workload from")
        total = float(sum(counts.values()))
        # count descending; ties: the larger key first (key order: cpu, gpu milli, gpu count, model string)
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        expected = float(popularity_threshold) * total / 100.0
        kept: list[tuple[tuple, float]] = []
        cum = 0.0
        while cum < expected and len(kept) < len(ranked):
            key, cnt = ranked[len(kept)]
            cum += float(cnt)
            kept.append((key, float(cnt) / total))
        if len(kept) < len(ranked):
            scale = cum / total
            weights = [p / scale for _, p in kept]
        else:  # every key kept: the reference leaves count/total as is
            weights = [p for _, p in kept]
        keys = [k for k, _ in kept]
        return cls(
            cpu=np.array([k[0] for k in keys], dtype=np.int64),
            gpu_milli=np.array([k[1] for k in keys], dtype=np.int64),
            num_gpu=np.array([k[2] for k in keys], dtype=np.int64),
            gpu_spec=tuple(k[3] for k in keys),
            weight=np.array(weights, dtype=np.float64),
            coverage=cum / total,
            n_keys_total=len(ranked),
        )

    @classmethod
    def from_specs(cls, specs: Sequence[tuple], weights: Sequence[float] | None = None) -> TargetWorkload:
        """Explicit typical pods: ``specs`` of (cpu_milli, gpu_milli, num_gpu[, gpu_spec]) with weights
        (default: uniform). Weights are used as given (they should sum to 1)."""
        rows = [tuple(s) + ("",) * (4 - len(s)) for s in specs]
        if weights is None:
            weights = [1.0 / len(rows)] * len(rows)
        return cls(
            cpu=np.array([r[0] for r in rows], dtype=np.int64),
            gpu_milli=np.array([r[1] for r in rows], dtype=np.int64),
            num_gpu=np.array([r[2] for r in rows], dtype=np.int64),
            gpu_spec=tuple(str(r[3]) for r in rows),
            weight=np.asarray(weights, dtype=np.float64),
            n_keys_total=len(rows),
        )

    def access_matrix(self, model_names: tuple[str, ...]) -> np.ndarray:
        """(M, n_models) bool: typical pod m may use GPU model j (no constraint, or model listed; a model
        name "" -- a node without GPUs -- is never allowed to a constrained pod)."""
        cached = self._access_cache.get(model_names)
        if cached is None:
            cached = np.ones((len(self), len(model_names)), dtype=bool)
            for m, spec in enumerate(self.gpu_spec):
                if spec:
                    allowed = set(spec.split("|"))
                    cached[m] = [bool(name) and name in allowed for name in model_names]
            cached.setflags(write=False)
            self._access_cache[model_names] = cached
        return cached

    def describe(self, top: int = 5) -> dict:
        order = range(min(top, len(self)))
        return {
            "n_typical": len(self),
            "n_keys_total": self.n_keys_total,
            "coverage_pct": round(100 * self.coverage, 2),
            "top": [
                {
                    "cpu_milli": int(self.cpu[m]),
                    "gpu_milli": int(self.gpu_milli[m]),
                    "num_gpu": int(self.num_gpu[m]),
                    "gpu_spec": self.gpu_spec[m],
                    "weight": float(self.weight[m]),
                }
                for m in order
            ],
        }
