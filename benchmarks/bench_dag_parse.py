"""DAG parse-time benchmark: every file of dags/ parsed by Airflow's DagBag, `--repeats` times, each time in a fresh
interpreter (as the dag-processor does), printed as JSON: per file the min / median / max seconds, the files over the
budget (`--budget-s`, 2 s: the parse time a DAG file should keep on an idle machine), CPU count and versions.
Exit status 1 when a file's median is over the budget.

    PYTHONPATH=. AIRFLOW_HOME=var/airflow .venv/bin/python benchmarks/bench_dag_parse.py [--repeats 5] [--budget-s 2]

The test suite checks parsing with a margin that a loaded 2-core host keeps (tests/dags/test_dagbag.py,
tests/transforms/test_transform_dag.py) and that parsing imports no heavy library; this measures it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGS = REPO_ROOT / "dags"

_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
def seconds(d):
    return d.total_seconds() if hasattr(d, "total_seconds") else float(d)
print(json.dumps({"errors": sorted(bag.import_errors),
                  "stats": {str(s.file): seconds(s.duration) for s in bag.dagbag_stats}}))
"""


def parse_once(dags: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(dags)]),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(dags)], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(f"DagBag probe failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=2.0)
    parser.add_argument("--dags", type=Path, default=DAGS)
    args = parser.parse_args(argv)
    runs = [parse_once(args.dags) for _ in range(max(1, args.repeats))]
    files = sorted({f for run in runs for f in run["stats"]})
    per_file = {}
    for f in files:
        times = [run["stats"][f] for run in runs if f in run["stats"]]
        per_file[f] = {
            "min_s": round(min(times), 4),
            "median_s": round(statistics.median(times), 4),
            "max_s": round(max(times), 4),
        }
    over = sorted(f for f, t in per_file.items() if t["median_s"] > args.budget_s)
    report = {
        "repeats": len(runs),
        "budget_s": args.budget_s,
        "over_budget": over,
        "import_errors": sorted({e for run in runs for e in run["errors"]}),
        "files": per_file,
        "environment": {
            "cpu_count": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": sys.version.split()[0],
            "apache-airflow": importlib.metadata.version("apache-airflow"),
        },
    }
    print(json.dumps(report, indent=2))
    return 1 if over or report["import_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
