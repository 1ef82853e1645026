"""Registry of ingest sources. Each loader module exposes SOURCES: list[Source]."""

from __future__ import annotations

import importlib

from warehouse.loaders.base import Column, LoadError, Source, read_checked_csv

_MODULES = (
    "warehouse.loaders.cluster",
    "warehouse.loaders.energy",
    "warehouse.loaders.interference",
    "warehouse.loaders.telemetry",
    "warehouse.loaders.grid",
)


def all_sources() -> dict[str, Source]:
    sources: dict[str, Source] = {}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for source in module.SOURCES:
            if source.name in sources:
                raise ValueError(f"duplicate source name {source.name!r}")
            sources[source.name] = source
    return sources


__all__ = ["Column", "LoadError", "Source", "read_checked_csv", "all_sources"]
