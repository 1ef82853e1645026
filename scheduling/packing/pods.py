"""Pod (task) model: CPU, memory, GPU count, per-GPU share and allowed GPU models.

Units follow the openb trace and the reference simulator: CPU in milli-cores, memory in MiB, GPU in milli-GPU
(1000 = one whole device). A pod asks for ``num_gpu`` devices with ``gpu_milli`` free on each: a *shared* pod
has ``num_gpu == 1`` and ``gpu_milli < 1000``; whole-GPU pods have ``gpu_milli == 1000``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MILLI = 1000  # milli-GPU in one device


def held_milli(gpu_milli):
    """The share of a device a pod holds when the device is shared by pods of its size: MILLI / floor(MILLI / m)
    (two 470-milli pods hold 500 each; an 810-milli pod leaves 190 that few pods fit, so it holds the device);
    whole-GPU shares as they are. Works on scalars and numpy arrays."""
    m = np.asarray(gpu_milli, dtype=float)
    held = np.where((m > 0) & (m < MILLI), MILLI / np.floor(MILLI / np.maximum(m, 1e-9)), m)
    return held if held.ndim else float(held)


def normalize_gpu_spec(spec: object) -> str:
    """`"V100M16||V100M32"` -> `"V100M16|V100M32"`: the empty `|` parts removed (as the reference's pod
    conversion does). None/NaN/"" -> "" (any model)."""
    if spec is None or (isinstance(spec, float) and spec != spec):
        return ""
    text = str(spec).strip()
    if not text or text.lower() == "nan":
        return ""
    return "|".join(part for part in text.split("|") if part)


@dataclass(frozen=True, slots=True)
class Pod:
    """One task to place.

    ``gpu_milli`` is the share *per device*. Normalization (as the reference maps a CSV row to a pod):
    ``gpu_milli`` is clipped to 1000; a pod with ``num_gpu == 0`` or ``gpu_milli <= 0`` asks for no GPU
    (both become 0). ``gpu_spec`` lists the allowed GPU models separated by ``|``; empty means any model;
    it is ignored (set to "") for CPU-only pods.
    """

    pod_id: str
    cpu_milli: int
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: str = ""
    gpu_models: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cpu, mem, k, g = int(self.cpu_milli), int(self.memory_mib), int(self.num_gpu), int(self.gpu_milli)
        if cpu < 0 or mem < 0 or k < 0:
            raise ValueError(f"pod {self.pod_id}: negative request (cpu={cpu}, memory={mem}, num_gpu={k})")
        g = min(g, MILLI)
        if k == 0 or g <= 0:
            k, g = 0, 0
        spec = normalize_gpu_spec(self.gpu_spec) if k else ""
        object.__setattr__(self, "cpu_milli", cpu)
        object.__setattr__(self, "memory_mib", mem)
        object.__setattr__(self, "num_gpu", k)
        object.__setattr__(self, "gpu_milli", g)
        object.__setattr__(self, "gpu_spec", spec)
        object.__setattr__(self, "gpu_models", frozenset(spec.split("|")) if spec else frozenset())

    @property
    def is_gpu(self) -> bool:
        return self.num_gpu > 0

    @property
    def is_shared(self) -> bool:
        """One device, partially (the reference's "share-gpu" pods)."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def score_key(self) -> tuple[int, int, int]:
        """What every score depends on (memory and the model list only matter to the filter)."""
        return (self.cpu_milli, self.gpu_milli, self.num_gpu)

    @property
    def affinity_tag(self) -> str | None:
        """GpuClustering's tag: "share-gpu", "<k>-gpu", or None for CPU-only pods."""
        if not self.num_gpu:
            return None
        return "share-gpu" if self.is_shared else f"{self.num_gpu}-gpu"

    def allows_model(self, model: str) -> bool:
        """GPU-model constraint (`IsNodeAccessibleToPodByType`): no constraint, or the node's model listed."""
        if not self.gpu_models:
            return True
        return bool(model) and model in self.gpu_models


def pods_from_frame(frame) -> list[Pod]:
    """Pods from a DataFrame with the openb pod-list columns (``name``, ``cpu_milli``, ``memory_mib``,
    ``num_gpu``, ``gpu_milli`` and optionally ``gpu_spec``). Raises ValueError naming the row and field of
    a bad value."""
    required = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"pod list lacks column(s) {missing}")
    specs = frame["gpu_spec"].tolist() if "gpu_spec" in frame.columns else [""] * len(frame)
    out: list[Pod] = []
    cols = [frame[c].tolist() for c in required]
    for row, (name, cpu, mem, k, g, spec) in enumerate(zip(*cols, specs)):
        try:
            out.append(Pod(str(name), int(cpu), int(mem), int(k), int(g), normalize_gpu_spec(spec)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"pod row {row} ({name!r}): {exc}") from exc
    return out
