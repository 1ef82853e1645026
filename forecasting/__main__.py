"""`python -m forecasting`: the command line of `forecasting.cli`."""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy and LightGBM start their thread pools

from forecasting.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
