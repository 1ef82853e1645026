"""GPU models as the planner and the power model see them: which Zeus-profiled power curve a model borrows and its
own power-limit range. `GPU_MAP` is the project's one GPU-name -> curve mapping (the fleet's `GpuModel.power_profile`
and the planner's power options read it); unknown names get the default curve."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

ZEUS_GPU_TYPES = ("a40", "p100", "rtx6000", "v100")
DEFAULT_CURVE = "default"


@dataclass(frozen=True)
class GpuSpec:
    """How a GPU model is modelled: the Zeus type whose relative curves it borrows (or 'default') and its own
    power-limit range in W (per GPU as the scheduler sees it)."""

    curve: str
    min_limit_w: float
    max_limit_w: float
    note: str


# THE GPU-model -> power-curve mapping of the project (single source of truth: the planner's power options and
# the fleet's `GpuModel.power_profile` read it from here; fleet.yaml no longer names curves). It lives here rather than
# in fleet.yaml because the power model must map any GPU name it meets (telemetry, job specs, models outside the
# fleet), not only the fleet's models. Nearest Zeus-profiled type by architecture / class. Limits: vendor board
# power; the minimum settable limit where known, else ~40 % of max (the Zeus sweeps span 33-50 % .. 100 %).
GPU_MAP: dict[str, GpuSpec] = {
    "a40": GpuSpec("a40", 100, 300, "profiled (Zeus)"),
    "v100": GpuSpec("v100", 100, 250, "profiled (Zeus, PCIe 250 W)"),
    "rtx6000": GpuSpec("rtx6000", 100, 260, "profiled (Zeus, Quadro RTX 6000)"),
    "p100": GpuSpec("p100", 125, 250, "profiled (Zeus)"),
    "v100m16": GpuSpec("v100", 150, 300, "V100 SXM2 16 GB (openb/PAI) -> V100 curve, 300 W board"),
    "v100m32": GpuSpec("v100", 150, 300, "V100 SXM2 32 GB (openb/PAI) -> V100 curve, 300 W board"),
    "v100-sxm2": GpuSpec("v100", 150, 300, "V100 SXM2 -> V100 curve"),
    "k80": GpuSpec(
        "p100", 100, 150, "Kepler K80 (one GK210 of the board) -> P100 curve (nearest older datacenter type)"
    ),
    "k40m": GpuSpec("p100", 180, 235, "Kepler K40m -> P100 curve"),
    "m60": GpuSpec("p100", 112, 150, "Maxwell M60 (one GPU of the board) -> P100 curve"),
    "misc": GpuSpec("p100", 100, 150, "PAI MISC (K40m/K80/M60) -> P100 curve"),
    "t4": GpuSpec("rtx6000", 60, 70, "Turing T4 -> Quadro RTX 6000 curve (same architecture)"),
    "rtx2080ti": GpuSpec("rtx6000", 100, 250, "Turing RTX 2080 Ti -> Quadro RTX 6000 curve"),
    "a10": GpuSpec("a40", 100, 150, "Ampere A10 (GA102, as A40) -> A40 curve"),
    "a100": GpuSpec("a40", 150, 400, "Ampere A100 SXM -> A40 curve (nearest architecture)"),
    "a100-80gb": GpuSpec("a40", 150, 400, "Ampere A100 80 GB -> A40 curve"),
    "h100": GpuSpec("a40", 200, 700, "Hopper H100 SXM -> A40 curve (no Hopper profile; approximate)"),
    "g1": GpuSpec(DEFAULT_CURVE, 100, 250, "openb undisclosed model -> default curve, 250 W assumed"),
    # G2/G3 are undisclosed too, but fleet.yaml already describes them as V100-class (300 W, speed 1.0) and
    # A100-class (400 W, speed 1.3); their curves follow the same assumption so one GPU is not two different GPUs.
    "g2": GpuSpec("v100", 150, 300, "openb undisclosed model, V100-class in fleet.yaml -> V100 curve, 300 W"),
    "g3": GpuSpec("a40", 150, 400, "openb undisclosed model, A100-class in fleet.yaml -> A40 curve (as a100), 400 W"),
}
UNKNOWN_SPEC = GpuSpec(DEFAULT_CURVE, 100, 250, "unknown model -> default curve, 100-250 W assumed")


def normalize_gpu_name(gpu_type: str) -> str:
    name = str(gpu_type).strip().lower().replace("nvidia ", "").replace("tesla ", "").replace("quadro ", "")
    name = name.replace(" ", "").replace("_", "-")
    aliases = {
        "v100-16gb": "v100m16",
        "v100-32gb": "v100m32",
        "rtx-6000": "rtx6000",
        "rtx6000-24gb": "rtx6000",
        "a100-sxm4-40gb": "a100",
        "a100-sxm4-80gb": "a100-80gb",
        "h100-80gbhbm3": "h100",
        "h100-sxm": "h100",
    }
    return aliases.get(name, name)


def map_gpu_type(gpu_type: str) -> GpuSpec:
    """The spec (curve source, limit range) for any GPU model name; unknown names get the default curve."""
    return GPU_MAP.get(normalize_gpu_name(gpu_type), UNKNOWN_SPEC)


def gpu_map_table() -> pd.DataFrame:
    rows = [
        dict(gpu_type=k, curve=v.curve, min_limit_w=v.min_limit_w, max_limit_w=v.max_limit_w, note=v.note)
        for k, v in GPU_MAP.items()
    ]
    return pd.DataFrame(rows)
