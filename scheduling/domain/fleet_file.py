"""Which fleet file the hourly plan reads: `FLEET_PATH` (environment), default `scheduling/domain/fleet.yaml`.

Kept free of numpy/pandas so that DAG files can read the configured regions while they parse (their Params list
them); the fleet itself is built by `scheduling.domain.fleet.load_fleet`. A relative `FLEET_PATH` is taken from the
checkout root, as `WAREHOUSE_PATH` is, so that the answer does not depend on the working directory of the process.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

DEFAULT_FLEET_PATH = Path(__file__).with_name("fleet.yaml")
REPO_ROOT = Path(__file__).resolve().parents[2]


def fleet_path() -> Path:
    """The configured fleet file: FLEET_PATH, else the default reference fleet."""
    raw = os.environ.get("FLEET_PATH", "").strip()
    if not raw:
        return DEFAULT_FLEET_PATH
    path = Path(raw).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def fleet_regions(path: str | Path | None = None) -> list[str]:
    """The region names of a fleet file (default: the configured one), in file order; ValueError naming the file
    when it cannot be read or has no `regions` mapping."""
    path = Path(path) if path else fleet_path()
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"fleet file {path}: {exc}") from exc
    regions = spec.get("regions") if isinstance(spec, dict) else None
    if not isinstance(regions, dict) or not regions:
        raise ValueError(f"fleet file {path}: needs a non-empty 'regions' mapping")
    return [str(r) for r in regions]


def fleet_gpu_models(path: str | Path | None = None) -> list[str]:
    """The GPU models the clusters of a fleet file have (default: the configured file), in file order."""
    path = Path(path) if path else fleet_path()
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"fleet file {path}: {exc}") from exc
    clusters = spec.get("clusters") if isinstance(spec, dict) else None
    if not isinstance(clusters, list):
        raise ValueError(f"fleet file {path}: needs a 'clusters' list")
    return list(dict.fromkeys(str(c["gpu_model"]) for c in clusters if isinstance(c, dict) and "gpu_model" in c))
