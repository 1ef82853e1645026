"""What a Pod asks for a GPU share: the `sharing` setting of the `kubernetes` executor names how the cluster
really shares GPUs, and a shared job (gpu_milli < 1000) requests that resource. The openb annotations
(`alibabacloud.com/gpu-milli`) stay on every Pod, but a stock scheduler ignores them.

    mechanism     setting keys            a job of `milli` per GPU on `count` GPUs requests
    none          -                       nvidia.com/gpu: count (a share gets whole GPUs)
    time-slicing  replicas, resource      <resource>: ceil(milli * count * replicas / 1000) replicas
                                          (NVIDIA device plugin `sharing.timeSlicing`; resource default
                                          nvidia.com/gpu, nvidia.com/gpu.shared with renameByDefault)
    mig           profiles                nvidia.com/mig-<p>: count, p the smallest listed profile with
                                          slices/7 >= milli/1000 (the plugin's `mixed` strategy)
    gpushare      gpu_memory_gib          aliyun.com/gpu-mem: ceil(milli/1000 * gpu_memory_gib) * count (GiB;
                                          the gpushare scheduler extender)

Whole-GPU jobs request nvidia.com/gpu: count under every mechanism. Time-slicing replicas should match the plan's
packing (replicas 10 for 100-milli steps); the plugin must not set failRequestsGreaterThanOne.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

MECHANISMS = ("none", "time-slicing", "mig", "gpushare")
WHOLE_GPU = "nvidia.com/gpu"
_MIG = re.compile(r"(\d+)g\.\d+gb")
_KEYS = {"none": (), "time-slicing": ("replicas", "resource"), "mig": ("profiles",), "gpushare": ("gpu_memory_gib",)}


@dataclass(frozen=True)
class GpuSharing:
    mechanism: str = "none"
    replicas: int = 0
    resource: str = WHOLE_GPU
    profiles: tuple[str, ...] = ()
    gpu_memory_gib: float = 0.0

    @classmethod
    def from_setting(cls, value: Mapping | str | None, where: str = "sharing") -> GpuSharing:
        """The sharing of a `sharing` setting ({mechanism, ...} or a mechanism name); ValueError naming the key."""
        value = {"mechanism": value} if isinstance(value, str) or value is None else dict(value)
        mechanism = str(value.pop("mechanism", None) or "none").strip().lower()
        if mechanism not in MECHANISMS:
            raise ValueError(f"{where}.mechanism: {mechanism!r} is not one of {', '.join(MECHANISMS)}")
        unknown = sorted(set(value) - set(_KEYS[mechanism]))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} for {mechanism}; known: {_KEYS[mechanism]}")
        if mechanism == "time-slicing":
            replicas = int(value.get("replicas", 0))
            if replicas < 2:
                raise ValueError(f"{where}.replicas: time-slicing needs the plugin's replicas (>= 2), got {replicas}")
            return cls(mechanism, replicas=replicas, resource=str(value.get("resource", WHOLE_GPU)))
        if mechanism == "mig":
            profiles = tuple(str(p) for p in value.get("profiles") or ())
            bad = [p for p in profiles if not _MIG.fullmatch(p)]
            if not profiles or bad:
                raise ValueError(f"{where}.profiles: MIG profiles such as 1g.10gb, 3g.40gb; got {list(profiles)}")
            return cls(mechanism, profiles=tuple(sorted(profiles, key=_slices)))
        if mechanism == "gpushare":
            memory = float(value.get("gpu_memory_gib", 0))
            if not memory > 0:
                raise ValueError(f"{where}.gpu_memory_gib: the GPUs' memory in GiB, > 0; got {memory}")
            return cls(mechanism, gpu_memory_gib=memory)
        return cls()

    def limits(self, milli: int, count: int) -> dict[str, str]:
        """The extended resources a job of `milli` per GPU on `count` GPUs requests (empty for no GPU)."""
        if count <= 0:
            return {}
        if milli >= 1000 or self.mechanism == "none":
            return {WHOLE_GPU: str(count)}
        if self.mechanism == "time-slicing":
            return {self.resource: str(max(1, math.ceil(milli * count * self.replicas / 1000)))}
        if self.mechanism == "mig":
            fits = [p for p in self.profiles if _slices(p) * 1000 >= milli * 7]
            if not fits:
                return {WHOLE_GPU: str(count)}
            return {f"nvidia.com/mig-{fits[0]}": str(count)}
        return {"aliyun.com/gpu-mem": str(math.ceil(milli * self.gpu_memory_gib / 1000) * count)}


def _slices(profile: str) -> int:
    return int(_MIG.fullmatch(profile).group(1))
