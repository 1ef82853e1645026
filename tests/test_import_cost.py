"""Entry points load no heavy library they do not use: the hourly plan's process and every command line start
without torch, LightGBM, Prophet, matplotlib or Airflow (their import costs seconds and hundreds of MB, and the
plan's memory target is measured on the whole process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

HEAVY = ("torch", "lightgbm", "prophet", "matplotlib", "airflow")
ENTRY_POINTS = (
    "scheduling.cli",
    "scheduling.tasks",
    "scheduling.service",
    "forecasting.cli",
    "forecasting.tasks",
    "pipeline.__main__",
    "warehouse.__main__",
)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_point_imports_no_heavy_library(module):
    probe = f"import importlib, json, sys; importlib.import_module({module!r}); print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not [name for name in HEAVY if name in loaded], f"{module} imports {[n for n in HEAVY if n in loaded]}"
