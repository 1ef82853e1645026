"""Run the dbt project (transforms/) as a subprocess, under the warehouse's single-writer lock.

    build(select=None, warehouse_path=None)  `dbt build` (models, seeds, data tests, unit tests)
    manifest()                               `dbt parse` -> transforms/target/manifest.json (for Cosmos)
    run_dbt(args, ...)                       any dbt command, locked when it touches the warehouse

Command line:
    python -m transforms.runner build [--select SEL ...] [--warehouse PATH]
    python -m transforms.runner manifest
    python -m transforms.runner docs           # dbt docs generate (target/index.html, catalog.json)
    python -m transforms.runner freshness      # dbt source freshness (live grid feeds)
    python -m transforms.runner exec -- ARGS   # dbt ARGS under the lock (the Cosmos executable, bin/dbt-locked)

dbt always gets an absolute --project-dir and --profiles-dir, and WAREHOUSE_PATH as an absolute path
(warehouse.config.warehouse_path(): WAREHOUSE_PATH, default <repo>/var/warehouse.duckdb). Commands that open the
warehouse hold the exclusive warehouse lock (warehouse.db.warehouse_lock) for their whole run, so dbt never meets
another writer or reader of the file (DuckDB allows one writing process). With WAREHOUSE_CATALOG=ducklake or
motherduck (and no explicit file), dbt runs with deploy/scale-out/profiles.yml (target DBT_TARGET, default the
catalog's name; DBT_THREADS default 1) and without the file lock: the catalog arbitrates writers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warehouse.config import REPO_ROOT as WAREHOUSE_ROOT
from warehouse.config import warehouse_path as configured
from warehouse.db import LOCK_TIMEOUT_S, warehouse_lock

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent
TARGET_DIR = PROJECT_DIR / "target"
MANIFEST_PATH = TARGET_DIR / "manifest.json"
LOCKED_DBT = PROJECT_DIR / "bin" / "dbt-locked"
PROFILE_NAME = "planner"
TARGET_NAME = "dev"
SCALE_OUT_PROFILES = REPO_ROOT / "deploy" / "scale-out"  # the targets of the shared catalogs (docs/scale-out.md)

# dbt commands that never open the warehouse: no lock needed.
_NO_WAREHOUSE = {"parse", "ls", "list", "deps", "clean", "init", "--version", "--help", "-h"}


class DbtError(RuntimeError):
    """dbt exited non-zero; the message holds the command and the end of its output."""

    def __init__(self, message: str, result: DbtResult):
        super().__init__(message)
        self.result = result


@dataclass
class DbtResult:
    args: list[str]
    returncode: int
    output: str
    counts: dict[str, int] = field(default_factory=dict)  # status -> count, from target/run_results.json
    unit_tests: int = 0

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def dbt_executable() -> str:
    """The dbt of this virtual environment (DBT_EXECUTABLE overrides), else dbt on PATH."""
    override = os.environ.get("DBT_EXECUTABLE")
    if override:
        return override
    beside = Path(sys.executable).with_name("dbt")
    if beside.exists():
        return str(beside)
    venv = REPO_ROOT / ".venv" / "bin" / "dbt"
    if venv.exists():
        return str(venv)
    found = shutil.which("dbt")
    if not found:
        raise FileNotFoundError("dbt executable not found (install requirements.txt or set DBT_EXECUTABLE)")
    return found


def resolve_warehouse(warehouse_path: str | Path | None = None) -> Path:
    """Absolute warehouse path: the argument, else warehouse.config.warehouse_path()."""
    if warehouse_path is None:
        return configured()
    path = Path(warehouse_path).expanduser()
    return path if path.is_absolute() else (WAREHOUSE_ROOT / path)


def shared_catalog() -> str | None:
    """The shared warehouse catalog WAREHOUSE_CATALOG names (ducklake, motherduck), or None for the local file."""
    mode = (os.environ.get("WAREHOUSE_CATALOG") or "").strip().lower()
    return None if mode in ("", "duckdb") else mode


def dbt_env(warehouse_path: Path, shared: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["WAREHOUSE_PATH"] = str(warehouse_path)
    if shared:  # deploy/scale-out/profiles.yml: its target, one thread (concurrent DuckLake commits conflict)
        env.setdefault("DBT_TARGET", shared)
        env.setdefault("DBT_THREADS", "1")
    env.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "False")
    env.setdefault("DBT_USE_COLORS", "False")
    env.setdefault("PYTHONPATH", str(REPO_ROOT))
    return env


def _needs_lock(args: Sequence[str]) -> bool:
    command = next((a for a in args if not a.startswith("-")), args[0] if args else "")
    return command not in _NO_WAREHOUSE


def _with_dirs(args: Sequence[str], profiles_dir: Path = PROJECT_DIR) -> list[str]:
    """Add absolute --project-dir / --profiles-dir unless the caller gave them (Cosmos passes its own)."""
    out = list(args)
    if not out or out[0].startswith("-"):
        return out
    if "--project-dir" not in out:
        out += ["--project-dir", str(PROJECT_DIR)]
    if "--profiles-dir" not in out:
        out += ["--profiles-dir", str(profiles_dir)]
    return out


def _counts(target_dir: Path) -> tuple[dict[str, int], int]:
    path = target_dir / "run_results.json"
    try:
        results = json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError):
        return {}, 0
    counts: dict[str, int] = {}
    unit = 0
    for item in results:
        status = str(item.get("status", "unknown")).lower()
        counts[status] = counts.get(status, 0) + 1
        if str(item.get("unique_id", "")).startswith("unit_test."):
            unit += 1
    return counts, unit


def run_dbt(
    args: Sequence[str],
    *,
    warehouse_path: str | Path | None = None,
    lock: bool | None = None,
    check: bool = True,
    stream: bool = False,
    lock_timeout_s: float | None = None,
    add_dirs: bool = True,
    cwd: str | Path | None = None,
    target_path: str | Path | None = None,
) -> DbtResult:
    """Run `dbt <args>` with absolute project/profiles dirs (unless `add_dirs` is False: the caller gives them);
    hold the exclusive warehouse lock while it runs when the command opens the warehouse (lock=None: decide from
    the command). `target_path`: dbt's artifacts folder (default transforms/target). Raises DbtError on failure if
    `check`."""
    db_path = resolve_warehouse(warehouse_path)
    # a shared catalog (no explicit file): its dbt profile, and no file lock (the catalog arbitrates writers)
    shared = shared_catalog() if warehouse_path is None else None
    profiles = SCALE_OUT_PROFILES if shared else PROJECT_DIR
    command = [dbt_executable(), *(_with_dirs(args, profiles) if add_dirs else args)]
    target = Path(target_path).resolve() if target_path is not None else TARGET_DIR
    if target_path is not None and args and not args[0].startswith("-"):
        command += ["--target-path", str(target)]
    env = dbt_env(db_path, shared)
    take_lock = (_needs_lock(args) if lock is None else lock) and not shared
    workdir = Path(cwd) if cwd is not None else PROJECT_DIR

    def _run() -> subprocess.CompletedProcess:
        if stream:
            proc = subprocess.run(command, env=env, cwd=workdir)
            return subprocess.CompletedProcess(command, proc.returncode, "", "")
        return subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True)

    if take_lock:
        with warehouse_lock(db_path, exclusive=True, timeout_s=lock_timeout_s or LOCK_TIMEOUT_S):
            proc = _run()
    else:
        proc = _run()
    output = (proc.stdout or "") + (proc.stderr or "")
    counts, unit = _counts(target) if add_dirs and args and args[0] in ("build", "test", "run", "seed") else ({}, 0)
    result = DbtResult(list(command), proc.returncode, output, counts, unit)
    if check and proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-40:])
        raise DbtError(f"dbt {' '.join(args)} failed (exit {proc.returncode}) on {db_path}:\n{tail}", result)
    return result


def build(
    select: str | Sequence[str] | None = None,
    warehouse_path: str | Path | None = None,
    *,
    exclude: str | Sequence[str] | None = None,
    check: bool = True,
    stream: bool = False,
    target_path: str | Path | None = None,
) -> DbtResult:
    """`dbt build` (seeds, models, data tests, unit tests) on the warehouse, under its write lock. The result's
    `counts` (status -> nodes) and `unit_tests` come from run_results.json."""
    args = ["build"]
    if select:
        args += ["--select", *([select] if isinstance(select, str) else list(select))]
    if exclude:
        args += ["--exclude", *([exclude] if isinstance(exclude, str) else list(exclude))]
    return run_dbt(args, warehouse_path=warehouse_path, check=check, stream=stream, target_path=target_path)


def manifest(warehouse_path: str | Path | None = None) -> Path:
    """`dbt parse`: writes transforms/target/manifest.json (Cosmos renders the DAG from it). Does not open the
    warehouse. Returns the manifest's path."""
    run_dbt(["parse"], warehouse_path=warehouse_path, lock=False)
    if not MANIFEST_PATH.exists():
        raise FileNotFoundError(f"dbt parse did not write {MANIFEST_PATH}")
    return MANIFEST_PATH


def docs(warehouse_path: str | Path | None = None) -> Path:
    """`dbt docs generate` (reads the warehouse catalog): target/index.html + catalog.json."""
    run_dbt(["docs", "generate"], warehouse_path=warehouse_path, lock=True)
    return TARGET_DIR / "index.html"


def freshness(warehouse_path: str | Path | None = None, check: bool = False) -> DbtResult:
    """`dbt source freshness` for the sources that declare it (the live grid feeds)."""
    return run_dbt(["source", "freshness"], warehouse_path=warehouse_path, lock=True, check=check)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["exec"]:
        # Used as Cosmos's dbt executable (bin/dbt-locked): pass everything through unchanged (Cosmos runs dbt in
        # its own copy of the project, as the working directory), streaming the output.
        rest = argv[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        result = run_dbt(rest, check=False, stream=True, add_dirs=False, cwd=os.getcwd())
        return result.returncode
    parser = argparse.ArgumentParser(prog="python -m transforms.runner", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="dbt build under the warehouse write lock")
    p.add_argument("--select", "-s", nargs="+")
    p.add_argument("--exclude", nargs="+")
    p.add_argument("--warehouse", help="DuckDB file (default: WAREHOUSE_PATH or var/warehouse.duckdb)")
    sub.add_parser("manifest", help="dbt parse -> transforms/target/manifest.json")
    p_docs = sub.add_parser("docs", help="dbt docs generate")
    p_docs.add_argument("--warehouse")
    p_fresh = sub.add_parser("freshness", help="dbt source freshness (live grid feeds)")
    p_fresh.add_argument("--warehouse")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            result = build(args.select, args.warehouse, exclude=args.exclude, stream=True, check=False)
            print(
                json.dumps({"returncode": result.returncode, "counts": result.counts, "unit_tests": result.unit_tests}),
                file=sys.stderr,
            )
            return result.returncode
        if args.command == "manifest":
            print(manifest())
            return 0
        if args.command == "docs":
            print(docs(args.warehouse))
            return 0
        if args.command == "freshness":
            result = run_dbt(
                ["source", "freshness"], warehouse_path=args.warehouse, lock=True, check=False, stream=True
            )
            return result.returncode
    except DbtError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
