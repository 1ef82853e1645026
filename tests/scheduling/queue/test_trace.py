"""The trace generator's whole output passes the intake: every job it emits parses and passes the fleet checks."""

from __future__ import annotations

import pandas as pd
import pytest

from scheduling.domain.jobs import read_pods
from scheduling.queue.checks import FleetFacts, check_jobs
from scheduling.queue.spec import JobSpecError, parse_job
from scheduling.queue.trace import trace_frame, trace_jobs

DAY = pd.Timestamp("2021-07-15", tz="UTC")


def _refused(jobs: list[dict], facts: FleetFacts) -> dict[str, str]:
    """job id -> why the intake's parsing or fleet checks refuse it."""
    refused, specs = {}, []
    for job in jobs:
        try:
            specs.append(parse_job(job))
        except JobSpecError as exc:
            refused[job["job_id"]] = str(exc)
    for spec, errors in check_jobs(specs, facts):
        if errors:
            refused[spec.job_id] = "; ".join(e.message(spec.job_id) for e in errors)
    return refused


@pytest.mark.parametrize("fleet_gpus", [0, 2000], ids=["configured-fleet", "bench-loop-fleet"])
def test_every_trace_job_passes_the_intake(data_dir, fleet_gpus):
    """21,010 jobs of one trace day (what `bench-loop --queued 20000` asks for) on the configured fleet and on the
    bench-loop's fleet of 2,000 GPUs; the day's draw holds the openb pod that requests 0 MiB of memory."""
    from scheduling.cli.bench_loop import bench_fleet

    fleet = bench_fleet(fleet_gpus, data_dir)
    n = 21_010
    frame = trace_frame(DAY, n, fleet, data_dir=data_dir)
    pods = read_pods(data_dir=data_dir).set_index("name")
    asked = pods.loc[frame["source_pod"], ["cpu_milli", "memory_mib"]]
    assert (asked["memory_mib"] == 0).any(), "the draw no longer holds a pod asking no memory: pick another day"
    jobs = trace_jobs(DAY, n, fleet, data_dir=data_dir)
    assert len(jobs) == len(frame) > 20_000
    assert _refused(jobs, FleetFacts.of(fleet, data_dir=data_dir)) == {}
    # the pods' own requests are kept where the queue takes them
    kept = (asked["memory_mib"] >= 1).to_numpy()
    assert (frame["memory_mib"].to_numpy()[kept] == asked["memory_mib"].to_numpy()[kept]).all()
    assert (frame["memory_mib"].to_numpy()[~kept] == 1).all()


def test_the_queue_sees_the_trace_jobs_as_the_simulator_does(data_dir):
    """On a fleet whose regions hold two clusters (the reference fleet's declared H100 clusters beside sampled
    ones), the queue homes each trace job where the trace does and reads the same home run time and deadline:
    the loop and the simulator plan the same jobs."""
    from scheduling.queue.frame import job_frame
    from scheduling.service import plan_fleet

    fleet = plan_fleet(None, data_dir)
    regions = pd.Series(fleet.cluster_regions)
    assert regions.duplicated().any()  # some region has several clusters
    frame = trace_frame(DAY, 400, fleet, data_dir=data_dir)
    specs = [parse_job(job) for job in trace_jobs(DAY, 400, fleet, data_dir=data_dir)]
    seen = job_frame(specs, fleet, data_dir=data_dir)
    assert list(seen["home_cluster"]) == list(frame["home_cluster"])
    assert seen["duration_h_home"].to_numpy() == pytest.approx(frame["duration_h_home"].to_numpy(), rel=1e-3)
    deadlines = pd.to_datetime(seen["deadline"], utc=True) - pd.to_datetime(frame["deadline"], utc=True)
    assert deadlines.abs().max() <= pd.Timedelta(seconds=1)
    from scheduling.domain.jobs import generate_jobs

    drawn = generate_jobs(400, DAY, 24, fleet, seed=int(DAY.strftime("%Y%m%d")), data_dir=data_dir)
    assert (drawn["home_cluster"] != frame["home_cluster"]).any()  # the generator drew homes the queue calls otherwise
