"""Shared pieces of the DAG files: Asset definitions (assets.py).

Importing this package also puts the repository root on sys.path, so DAG files can import the project's packages
(warehouse, transforms, forecasting, scheduling) even when Airflow was started without PYTHONPATH set.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))
