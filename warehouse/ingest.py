"""Run sources into the warehouse: the engine behind `python -m warehouse ingest` and the ingest DAGs."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from warehouse.config import data_dir as default_data_dir
from warehouse.db import LoadResult, load_batch, writer
from warehouse.loaders import all_sources


def ingest(
    names: list[str] | None = None,
    *,
    data_dir: Path | None = None,
    db_path: Path | None = None,
    progress: bool = True,
) -> list[LoadResult]:
    """Load the named sources (all when None) from DATA_DIR; returns one result per batch."""
    sources = all_sources()
    if names:
        unknown = [n for n in names if n not in sources]
        if unknown:
            raise KeyError(f"unknown source(s) {unknown}; known: {sorted(sources)}")
        chosen = [sources[n] for n in names]
    else:
        chosen = list(sources.values())
    root = Path(data_dir) if data_dir else default_data_dir()
    if not root.exists():
        raise FileNotFoundError(f"DATA_DIR {root} does not exist; set DATA_DIR to the folder holding the sources")
    results: list[LoadResult] = []
    bar = tqdm(total=len(chosen), desc="ingest", unit="source", disable=None if progress else True, file=sys.stderr)
    with writer(db_path) as con:
        for source in chosen:
            bar.set_postfix_str(source.name)
            for batch in source.batches(root):
                results.append(load_batch(con, batch))
                bar.set_postfix_str(f"{source.name}: {batch.table} {len(batch.frame):,} rows")
            bar.update(1)
    bar.close()
    return results


def summarize(results: list[LoadResult]) -> list[dict]:
    by_table: dict[str, dict] = {}
    for r in results:
        entry = by_table.setdefault(r.table, {"table": r.table, "batches": 0, "rows": 0, "rejected": 0, "unchanged": 0})
        entry["batches"] += 1
        entry["rows"] += r.rows
        entry["rejected"] += r.rejected
        entry["unchanged"] += int(r.skipped_unchanged)
    return sorted(by_table.values(), key=lambda e: e["table"])


__all__ = ["ingest", "summarize", "asdict"]
