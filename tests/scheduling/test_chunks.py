"""The chunk rule for long checkpointing jobs (`scheduling.planning.chunks`), and the simulator running it: the
runs of a chunked job add up to exactly its work, each stop paying the checkpoint."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scheduling.planning.chunks import RESUME_WAIT_H, chunk_hours, chunk_shares, rest_hours


def test_only_checkpointing_jobs_longer_than_the_horizon_are_chunked():
    left = np.array([200.0, 168.0, 500.0, 500.0, np.inf])
    ck = np.array([True, True, True, False, True])
    share = chunk_shares(left, ck, 168)
    assert chunk_hours(168) == 84.0
    assert share == pytest.approx([84 / 200, 1.0, 84 / 500, 1.0, 1.0])
    rest = rest_hours(left, share, np.full(5, 5 / 60))
    # after its 84-hour chunk a 200-hour job needs the hour's wait, the restore and its other 116 hours
    assert rest == pytest.approx([RESUME_WAIT_H + 5 / 60 + 116, 0.0, RESUME_WAIT_H + 5 / 60 + 416, 0.0, 0.0])


def test_the_planner_plans_a_long_job_chunk_by_chunk_and_decides_it_at_each_chunks_end(data_dir):
    """A 48-hour horizon, so every checkpointing job of more than 48 hours at its fastest is planned in chunks: one
    such job, planned alone hour by hour as the simulator does (`HourlyPlanner`): its run's first chunk is 24 hours
    of work at its fastest (longer on a slower option or cluster) plus the checkpoint; it is weighed only at the ends
    of its chunks; whatever stops it keeps the work done by the checkpoint signal, and it ends by its deadline.
    Without chunks the run has none."""
    from scheduling.evaluation.scenario import build_scenario
    from scheduling.planning.chunks import at_chunk_end
    from scheduling.planning.session import HourlyPlanner

    sc = build_scenario(start="2021-07-05", days=2, n_jobs=60, regions=6, load=0.5, seed=3, forecasts="dacf",
                        data_dir=data_dir, grid_source="files", tail_days=20, max_duration_h=120)  # fmt: skip
    tbl = sc.table
    fastest = np.where(tbl.allowed, tbl.dur[:, 0], np.inf).min(axis=1)
    ck = tbl.jobs["checkpointing"].to_numpy(bool)
    j = int(np.flatnonzero(ck & np.isfinite(fastest) & (fastest > 60))[0])
    save = tbl.checkpoint_h[j]
    for chunks in (True, False):
        hp = HourlyPlanner(sc.fleet, table=tbl, policy="rolling-lp", forecasts=sc.forecasts, workload=sc.workload,
                           explain=False, max_horizon=48, chunks=chunks)  # fmt: skip
        t, runs, weighed = int(tbl.submit_h[j]), [], []
        while not (hp.started[j] and hp.end_occ_h[j] <= t):
            hour = pd.Timestamp(t * 3_600_000_000_000, tz="UTC")
            hp.release_finished(t)
            if hp.in_chunks(t):
                start, first = hp.start_h[j], hp.chunk_end_h[j]
                if hp.pause_running(hour, t):
                    weighed.append(bool(at_chunk_end([_ts(start)], [_ts(first)], hour)[0]))
            if not hp.started[j]:
                done_before = hp.work_done[j]
                hp.plan_outcome(hour, [j])
                if hp.started[j]:
                    runs.append(done_before)
                    full = tbl.dur[j, hp.k[j], hp.c[j]]
                    if chunks and fastest[j] * (1 - done_before) > 48:
                        restore = save if done_before > 0 else 0.0
                        assert hp.chunk_end_h[j] - t == pytest.approx(restore + 24 / fastest[j] * full + save)
                    else:
                        assert np.isnan(hp.chunk_end_h[j])
            t += 1
        assert all(weighed) and len(runs) == 1 + len(weighed) == 1 + hp.preemptions[j]
        if not chunks:
            assert not weighed
        last = hp.start_h[j] + hp.run_hours(j)
        assert last <= tbl.deadline_h[j] + tbl.deadline_spare[j] + 1e-6


def _ts(hours: float) -> pd.Timestamp:
    return pd.Timestamp(round(hours * 3_600_000_000_000), tz="UTC")
