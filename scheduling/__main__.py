"""`python -m scheduling <command>`: see scheduling.cli."""

import os
import sys

# One thread for numpy/torch/LightGBM before any of them loads: on 2 shared cores more threads run far slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from scheduling.cli import main  # noqa: E402 - after the thread setting

if __name__ == "__main__":
    sys.exit(main())
