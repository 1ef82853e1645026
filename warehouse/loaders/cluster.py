"""Cluster traces: the Alibaba openb GPU trace (nodes, pods), Alibaba PAI 2020 machine specs, Philly job durations.

Tables (one batch per file, batch_id = "<source>:<path relative to DATA_DIR>"):
- raw.openb_nodes: both node lists, `variant` = gpu_node | all_node.
- raw.openb_pods: all openb_pod_list_*.csv files, `variant` = the part after `openb_pod_list_` (default, cpu050,
  multigpu40, ...). The multigpu files have only the first 5 columns; the others are NULL there.
- raw.pai_machine_specs: interference/cluster_specs/alibaba_pai2020_machine_spec.csv.
- raw.philly_runtimes: interference/job_durations/philly_runtime.csv (seconds).
- raw.philly_job_distribution: interference/gavel/philly_job_distribution.csv (Gavel's (duration, #GPUs) list).

openb/fixtures/ holds test fixtures of the FGD replay and is not loaded.

This module also holds `csv_source`, the small factory the energy and interference loaders share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pandas as pd

from warehouse.db import Batch
from warehouse.loaders.base import Column, Source, read_checked_csv, relative_name

Constants = Callable[[Path], dict[str, object]]
Transform = Callable[[pd.DataFrame, Path], pd.DataFrame]


def batch_id(source: str, path: Path, data_dir: Path) -> str:
    """Stable batch key: source name + the file's path relative to DATA_DIR."""
    return f"{source}:{relative_name(path, data_dir)}"


def glob_files(data_dir: Path, patterns: Iterable[str]) -> list[Path]:
    """Existing files matching any of the patterns (relative to DATA_DIR), sorted, without duplicates."""
    found = {p for pattern in patterns for p in Path(data_dir).glob(pattern) if p.is_file()}
    return sorted(found)


def with_constants(frame: pd.DataFrame, constants: dict[str, object]) -> pd.DataFrame:
    """Prepend constant columns (e.g. the variant parsed from the file name), typed as pandas string/Int64."""
    front = {}
    for name, value in constants.items():
        if isinstance(value, bool):
            dtype = "boolean"
        elif isinstance(value, int):
            dtype = "Int64"
        elif isinstance(value, float):
            dtype = "Float64"
        else:
            dtype = "string"
        front[name] = pd.Series([value] * len(frame), index=frame.index, dtype=dtype)
    return pd.concat([pd.DataFrame(front, index=frame.index), frame], axis=1)


def read_csv_batch(
    source: str,
    table: str,
    path: Path,
    data_dir: Path,
    columns: list[Column],
    *,
    key: list[str] | None = None,
    constants: Constants | None = None,
    transform: Transform | None = None,
) -> Batch:
    """One checked CSV file as a Batch."""
    frame, rejections = read_checked_csv(path, columns, key=key)
    if constants is not None:
        frame = with_constants(frame, constants(path))
    if transform is not None:
        frame = transform(frame, path)
    return Batch(table, batch_id(source, path, data_dir), source, frame, rejections)


def csv_source(
    name: str,
    group: str,
    description: str,
    table: str,
    patterns: list[str],
    columns: list[Column],
    *,
    key: list[str] | None = None,
    constants: Constants | None = None,
    transform: Transform | None = None,
) -> Source:
    """A Source whose files (globs under DATA_DIR) are each one checked CSV batch into `table`."""

    def files(data_dir: Path) -> list[Path]:
        return glob_files(data_dir, patterns)

    def batches(data_dir: Path) -> Iterator[Batch]:
        for path in files(data_dir):
            yield read_csv_batch(
                name, table, path, data_dir, columns, key=key, constants=constants, transform=transform
            )

    return Source(name, group, description, batches, files)


# --- openb ------------------------------------------------------------------------------------------------------

NODE_COLUMNS = [
    Column("sn", "str"),
    Column("cpu_milli", "int", min_value=0),
    Column("memory_mib", "int", min_value=0),
    Column("gpu", "int", min_value=0, rename="num_gpu"),
    Column("model", "str", nullable=True, rename="gpu_model"),  # empty for CPU-only nodes
]

POD_COLUMNS = [
    Column("name", "str"),
    Column("cpu_milli", "int", min_value=0),
    Column("memory_mib", "int", min_value=0),
    Column("num_gpu", "int", min_value=0),
    Column("gpu_milli", "int", min_value=0, max_value=1000),
    # The multigpu* files stop after gpu_milli: the rest may be absent from the header (NULL then).
    Column("gpu_spec", "str", nullable=True, required=False),
    Column("qos", "str", required=False),
    Column("pod_phase", "str", required=False),
    Column("creation_time", "int", min_value=0, rename="creation_time_s", required=False),
    Column("deletion_time", "int", min_value=0, rename="deletion_time_s", required=False),
    Column("scheduled_time", "int", min_value=0, nullable=True, rename="scheduled_time_s", required=False),
]

NODE_PREFIX = "openb_node_list_"
POD_PREFIX = "openb_pod_list_"


def _variant(prefix: str) -> Constants:
    return lambda path: {"variant": path.stem[len(prefix) :] if path.stem.startswith(prefix) else path.stem}


openb_nodes = csv_source(
    "openb_nodes",
    "cluster",
    "Alibaba openb GPU trace node lists (gpu_node 1213, all_node 1523) -> raw.openb_nodes",
    "raw.openb_nodes",
    [f"openb/{NODE_PREFIX}*.csv"],
    NODE_COLUMNS,
    key=["sn"],
    constants=_variant(NODE_PREFIX),
)

openb_pods = csv_source(
    "openb_pods",
    "cluster",
    "Alibaba openb GPU trace pod lists, all 24 variants -> raw.openb_pods",
    "raw.openb_pods",
    [f"openb/{POD_PREFIX}*.csv"],
    POD_COLUMNS,
    key=["name"],
    constants=_variant(POD_PREFIX),
)

# --- Alibaba PAI 2020 machine inventory -----------------------------------------------------------------------------

pai_machine_specs = csv_source(
    "pai_machine_specs",
    "cluster",
    "Alibaba PAI 2020 machine inventory (1,897 machines) -> raw.pai_machine_specs",
    "raw.pai_machine_specs",
    ["interference/cluster_specs/alibaba_pai2020_machine_spec.csv"],
    [
        Column("machine", "str"),
        Column("gpu_type", "str"),
        Column("cap_cpu", "int", min_value=0, rename="cap_cpu_cores"),
        Column("cap_mem", "int", min_value=0, rename="cap_mem_gb"),
        Column("cap_gpu", "int", min_value=0),
    ],
    key=["machine"],
)

# --- Philly job durations -------------------------------------------------------------------------------------------

philly_runtimes = csv_source(
    "philly_runtimes",
    "cluster",
    "Microsoft Philly job runtimes (via alibaba/clusterdata, seconds) -> raw.philly_runtimes",
    "raw.philly_runtimes",
    ["interference/job_durations/philly_runtime.csv"],
    [Column("runtime", "float", min_value=0, rename="runtime_s")],
)

philly_job_distribution = csv_source(
    "philly_job_distribution",
    "cluster",
    "Gavel's Philly job distribution (duration s, #GPUs) -> raw.philly_job_distribution",
    "raw.philly_job_distribution",
    ["interference/gavel/philly_job_distribution.csv"],
    [Column("duration_s", "float", min_value=0), Column("num_gpus", "int", min_value=0)],
)

SOURCES: list[Source] = [openb_nodes, openb_pods, pai_machine_specs, philly_runtimes, philly_job_distribution]
