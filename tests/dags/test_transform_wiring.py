"""The transform DAG runs every dbt node and every data/unit test of the project, each test after all of its
parents are built, reading the selection of each of its dbt tasks the way dbt does (from the manifest)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.dags.conftest import DAGS, REPO_ROOT, airflow_env

# Each dbt task of the DAG: task id, dbt command, --select, --indirect-selection, upstream task ids.
_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=sys.argv[1]).dags["transform"]
out = []
for t in dag.tasks:
    if not hasattr(t, "select"):
        continue
    flags = list(t.dbt_cmd_flags or [])
    mode = flags[flags.index("--indirect-selection") + 1] if "--indirect-selection" in flags else "eager"
    select = [t.select] if isinstance(t.select, str) else list(t.select or [])  # Cosmos: "fqn:planner.marts.x"
    out.append({"task": t.task_id, "kind": type(t).__name__, "select": select, "mode": mode,
                "upstream": sorted(t.get_flat_relative_ids(upstream=True))})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def manifest() -> dict:
    from transforms import cosmos_config, runner

    if not cosmos_config.manifest_is_fresh():
        runner.manifest()  # what set-up does (`dbt parse`)
    return json.loads(cosmos_config.MANIFEST_PATH.read_text())


def _tasks(tmp_path) -> list[dict]:
    env = airflow_env(tmp_path / "home", tmp_path / "wh.duckdb")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS / "transform.py")],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_node_and_test_runs_after_its_parents(tmp_path, manifest):
    nodes = {**manifest["nodes"], **manifest.get("unit_tests", {})}
    parents = {k: set(v.get("depends_on", {}).get("nodes", [])) for k, v in nodes.items()}
    built = {k for k, v in nodes.items() if v["resource_type"] in ("model", "seed")}
    tests = {k for k, v in nodes.items() if v["resource_type"] in ("test", "unit_test")}

    def ancestors(node: str) -> set[str]:
        out, todo = set(), [node]
        while todo:
            for p in parents.get(todo.pop(), ()):
                if p not in out:
                    out.add(p)
                    todo.append(p)
        return out

    def matches(node: str, selector: str) -> bool:
        info = nodes[node]
        if selector.startswith("path:"):
            return info["original_file_path"].startswith(selector[5:].rstrip("/") + "/")
        if selector.startswith("fqn:"):
            return ".".join(info["fqn"]) == selector[4:]
        raise AssertionError(f"selector {selector!r}: teach this test how dbt reads it")

    tasks = _tasks(tmp_path)
    builds_of, tests_of = {}, {}  # task -> nodes it builds / tests it runs
    for t in tasks:
        if t["select"] == ["source:raw"]:  # the tests on raw.* sources
            tests_of[t["task"]] = {x for x in tests if parents[x] and all(p.startswith("source.") for p in parents[x])}
            continue
        chosen = {n for n in built if any(matches(n, s) for s in t["select"])}
        assert chosen, f"{t['task']} selects nothing: {t['select']}"
        if "Build" in t["kind"]:
            builds_of[t["task"]] = chosen
        reach = chosen | set().union(*(ancestors(n) for n in chosen))
        rule = {
            "eager": lambda x: bool(parents[x] & chosen),
            "buildable": lambda x: bool(parents[x] & chosen) and parents[x] <= reach,
            "cautious": lambda x: bool(parents[x] & chosen) and parents[x] <= chosen,
        }[t["mode"]]
        tests_of[t["task"]] = {x for x in tests if rule(x)}

    built_by = {}
    for task, chosen in builds_of.items():
        for n in chosen:
            built_by.setdefault(n, []).append(task)
    assert {n: ts for n, ts in built_by.items() if len(ts) > 1} == {}, "a node built by two tasks"
    assert sorted(built - set(built_by)) == [], "nodes no task builds"
    ran = set().union(*tests_of.values())
    assert sorted(tests - ran) == [], "tests no task runs"
    # Every test runs only in a task downstream of (or building) all of its parents.
    upstream = {t["task"]: set(t["upstream"]) | {t["task"]} for t in tasks}
    early = [
        (x, task)
        for task, xs in tests_of.items()
        for x in xs
        if any(p in built and not set(built_by[p]) & upstream[task] for p in parents[x])
    ]
    assert early == [], "tests that run before one of their parents is built"
