"""Packing benchmark: one full default-trace FGD replay (10,866 pods, fixture order of seed 42) with the
decision-latency distribution, printed as JSON with CPU count and versions.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_packing.py [--policy fgd] [--repeats 3]

Same as `python -m scheduling bench-packing --json`.
"""

from __future__ import annotations

import sys

from scheduling.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["bench-packing", *sys.argv[1:]]))
