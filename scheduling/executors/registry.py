"""The executor registry: `make_executor(kind, settings)` builds the executor a cluster names (fleet: ``executor:
{kind, ...settings}``). Unknown kinds raise `common.registry.UnknownNameError`; unknown settings a ValueError
naming the executor and the setting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.registry import Registry
from scheduling.executors.base import Executor

EXECUTORS = Registry("executor")
EXECUTORS.register("replay", "scheduling.executors.replay:ReplayExecutor")  # the embedded default
EXECUTORS.register("files", "scheduling.executors.files:FilesExecutor")
EXECUTORS.register("kubernetes", "scheduling.executors.k8s:KubernetesExecutor")
EXECUTORS.register("slurm", "scheduling.executors.slurm:SlurmExecutor")
DEFAULT_EXECUTOR = "replay"


def make_executor(kind: str | None = None, settings: Mapping[str, Any] | None = None, *, db_path=None) -> Executor:
    """The executor `kind` (case-insensitive; None: the default, replay) with `settings` (a mapping of the
    executor's settings; a `kind` key in it must agree). `db_path`: the warehouse (default WAREHOUSE_PATH)."""
    settings = dict(settings or {})
    named = settings.pop("kind", None)
    kind = str(kind or named or DEFAULT_EXECUTOR).strip().lower()
    if named is not None and str(named).strip().lower() != kind:
        raise ValueError(f"executor kind {kind!r} given, but its settings say kind {named!r}")
    factory = EXECUTORS.factory(kind)
    known = tuple(getattr(factory, "SETTINGS", ()))
    unknown = sorted(k for k in settings if k not in known)
    if unknown:
        raise ValueError(f"executor {kind!r}: unknown setting(s) {unknown}; known: {', '.join(known)}")
    return EXECUTORS.create(kind, db_path=db_path, **settings)
