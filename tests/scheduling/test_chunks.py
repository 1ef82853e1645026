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


def test_the_simulator_runs_a_long_job_in_chunks_that_add_up_to_its_work(data_dir):
    """A 48-hour horizon, so every checkpointing job of more than 48 hours at its fastest is chunked. One such job,
    planned alone hour by hour (`HourlyPlanner`, the loop's and the simulator's planner): each run stops at the
    first hour after its chunk, keeping the work done by its checkpoint signal (`execution.kept_share`), the next
    resumes with the restore, and the last run is the whole rest, which ends by the deadline; without chunks the job
    is one run."""
    from scheduling.evaluation.scenario import build_scenario
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
        runs, t = [], int(tbl.submit_h[j])
        while True:
            hp.release_finished(t)
            stopped = hp.end_chunks(t)
            if stopped:
                (_, start, ran, k, c) = hp.preempted_runs[-1]
                runs.append((start, ran, k, c))
            if not hp.started[j]:
                done_before = hp.work_done[j]
                hp.plan_outcome(pd.Timestamp(t * 3_600_000_000_000, tz="UTC"), [j])
                if hp.started[j]:
                    left = fastest[j] * (1 - done_before)
                    chunk_end = hp.chunk_end_h[j]
                    if chunks and left > 48:
                        full = tbl.dur[j, hp.k[j], hp.c[j]]
                        restore = save if done_before > 0 else 0.0
                        # the chunk: 24 hours of work at the fastest, on this option and cluster, the checkpoint after
                        assert chunk_end - t == pytest.approx(restore + 24 / fastest[j] * full + save)
                    else:
                        assert np.isnan(chunk_end)
            elif np.isnan(hp.chunk_end_h[j]):  # the last run: whole
                break
            t += 1
        if not chunks:
            assert not runs and hp.preemptions[j] == 0
            continue
        assert len(runs) >= 1 and hp.preemptions[j] == len(runs)
        done = 0.0
        for _start, ran, k, c in runs:  # each stopped run keeps the work by its checkpoint signal
            full = tbl.dur[j, k, c]
            done += (ran - (save if done > 0 else 0.0) - save) / full
            assert ran == int(np.ceil(ran)) and ran >= 24 / fastest[j] * full
        assert hp.work_done[j] == pytest.approx(done)
        last = save + tbl.dur[j, hp.k[j], hp.c[j]] * (1 - done)
        assert hp.start_h[j] + last <= tbl.deadline_h[j] + tbl.deadline_spare[j] + 1e-6
        assert fastest[j] * (1 - done) <= 48 + 1e-9  # the rest fits the horizon
