"""Fixtures for the job-queue tests: the default fleet (real node lists from DATA_DIR) and its check facts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def fleet(data_dir):
    from scheduling.domain.fleet import load_fleet

    # the reference fleet's batch clusters (sampled): its declared H100 clusters would host nearly every job
    return load_fleet(data_dir=data_dir).sampled()


@pytest.fixture(scope="session")
def facts(fleet, data_dir):
    from scheduling.queue.checks import FleetFacts

    return FleetFacts.of(fleet, data_dir=data_dir)
