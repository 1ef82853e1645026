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
    ck_h = 5 / 60
    rest = rest_hours(left, share, np.full(5, ck_h), 168)
    # after its 84-hour chunk a 200-hour job needs the hour's wait, the restore and its other 116 hours; a 500-hour
    # job's other 416 hours stop three more times (332 and 248 left, then 164 within the horizon), each stop paying
    # the checkpoint, the wait and the restore
    stop = ck_h + RESUME_WAIT_H + ck_h
    assert rest == pytest.approx([RESUME_WAIT_H + ck_h + 116, 0.0, RESUME_WAIT_H + ck_h + 416 + 3 * stop, 0.0, 0.0])


def test_the_simulator_runs_a_long_job_in_chunks_that_add_up_to_its_work(data_dir):
    """A 48-hour horizon, so every checkpointing job of more than 48 hours at its fastest is chunked. One such job,
    planned alone hour by hour (`HourlyPlanner`, the loop's and the simulator's planner): each run stops at the
    first hour after its chunk, keeping the work done by its checkpoint signal (`execution.kept_share`), its GPUs
    held until the next hour; the next resumes with the restore from that hour at the earliest, and the last run is
    the whole rest, which ends by the deadline; without chunks the job is one run."""
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
                # its GPUs wait for the rest until the next hour's plan: bound, and taken in the plan's capacity
                assert hp.agents[c].end_hour[str(tbl.jobs["job_id"].iat[j])] == t + 1
                assert hp.usage(t, 2)[0, :, c].tolist() == [tbl.gpu_total[j], 0]
            if j in hp.pending(t):
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
            elif hp.started[j] and np.isnan(hp.chunk_end_h[j]):  # the last run: whole
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
        starts = [start for start, *_ in runs] + [hp.start_h[j]]
        for (start, ran, *_), resumed in zip(runs, starts[1:]):  # queued again from the hour after the stop
            assert resumed >= start + ran + 1
        last = save + tbl.dur[j, hp.k[j], hp.c[j]] * (1 - done)
        assert hp.start_h[j] + last <= tbl.deadline_h[j] + tbl.deadline_spare[j] + 1e-6
        assert fastest[j] * (1 - done) <= 48 + 1e-9  # the rest fits the horizon


def test_the_loops_plan_holds_a_chunks_gpus_an_hour_past_its_stop_for_the_rest():
    """`service.running_ends`: the end each running job holds its GPUs until in the hour's plan. A run whose chunk
    ends inside this hour holds them to the end of the next hour (stopped then, its GPUs wait for its rest until the
    plan after); one stopped for its chunk now, until the next plan; one paused for carbon now, not at all; a whole
    run, until its projected end."""
    from scheduling.service import running_ends

    T = pd.Timestamp("2021-07-15T12:00Z")
    hour = pd.Timedelta(hours=1)
    running = pd.DataFrame(
        {
            "job_id": ["chunk-later", "chunk-now", "paused", "whole"],
            "end_time": [T + 30 * hour] * 4,
            "chunk_end": [T + pd.Timedelta(minutes=20), T - pd.Timedelta(minutes=40), pd.NaT, pd.NaT],
        }
    )
    recaps = pd.DataFrame({"job_id": running["job_id"], "expected_end": [T + 29 * hour] * 4})
    pauses = pd.DataFrame({"job_id": ["chunk-now", "paused"], "reason": ["chunk", "carbon"]})
    ends = running_ends(running, recaps, pauses, T).set_index("job_id")["end_time"]
    assert ends.to_dict() == {"chunk-later": T + 2 * hour, "chunk-now": T + hour, "paused": T, "whole": T + 29 * hour}
