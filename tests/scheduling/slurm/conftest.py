"""The `slurm_cluster` fixture: a real Slurm on this machine for the test module, stopped afterwards.

Skips, saying why, only when the tests do not run as root or slurm-wlm/munge are missing and cannot be installed
(deploy/install-services.sh installs them as root; CI runs it through `make test`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.scheduling.slurm.cluster import LocalSlurm, missing_packages


@pytest.fixture(scope="module")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests start munged, slurmctld and slurmd: they need root")
    if missing_packages():
        subprocess.run(["bash", str(REPO_ROOT / "deploy" / "install-services.sh"), "slurm"], check=False, timeout=600)
    if missing_packages():
        pytest.skip(f"slurm-wlm/munge not installed and could not be installed (missing {missing_packages()})")
    folder = Path(tempfile.mkdtemp(prefix="cp-slurm-"))
    cluster = LocalSlurm(folder, prolog=REPO_ROOT / "deploy" / "slurm" / "prolog-power-limit.sh")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
