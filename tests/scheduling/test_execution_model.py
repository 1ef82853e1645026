"""The execution model (`scheduling.domain.execution`) for checkpoints, preemption, resumption and failures,
against hand-computed runs, in Timestamps (the executors) and in float hours (the simulator); the simulator's
vectorised forms (`kept_share`, `run_wall_h`) agree with the segment forms run by run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.execution import (
    Checkpoint,
    Segment,
    end_time,
    failure_work_h,
    kept_share,
    kept_work_h,
    resume_segments,
    run_wall_h,
    work_done_h,
)

H = pd.Timedelta(hours=1)
T0 = pd.Timestamp("2021-07-15T12:00Z")


def test_checkpoint_minutes_and_bad_values():
    ck = Checkpoint.minutes(5)
    assert ck.save_h == ck.restore_h == pytest.approx(5 / 60) and ck.wall_h == pytest.approx(10 / 60)
    with pytest.raises(ValueError, match="non-negative number of minutes"):
        Checkpoint.minutes(-1)


def test_a_stopped_run_keeps_the_work_at_its_checkpoint_signal():
    # 3 h at factor 1, then capped to 1.5: stopped at 5 h with a 0.25 h save -> signal at 4.75 h:
    # 3 + 1.75 / 1.5 reference hours
    segs = [Segment(T0, 1.0), Segment(T0 + 3 * H, 1.5)]
    assert kept_work_h(segs, T0 + 5 * H, 0.25) == pytest.approx(3 + 1.75 / 1.5)
    assert kept_work_h(segs, T0 + 5 * H, 0.25, checkpointing=False) == 0.0
    assert kept_work_h(segs, T0 + 0.1 * H, 0.25) == 0.0  # told to stop before it had done any work


def test_a_resumed_run_restores_then_works_and_a_change_meanwhile_applies_when_work_begins():
    # restore 0.5 h; a cap to 2.0 at +0.25 h (during the restore) holds from +0.5 h; back to 1.0 at +2.5 h
    segs = resume_segments(T0, 0.5, [Segment(T0 + 0.25 * H, 2.0), Segment(T0 + 2.5 * H, 1.0)])
    assert segs == [Segment(T0 + 0.5 * H, 2.0), Segment(T0 + 2.5 * H, 1.0)]
    assert work_done_h(segs, T0 + 0.5 * H) == 0.0
    assert work_done_h(segs, T0 + 2.5 * H) == pytest.approx(1.0)  # 2 h at 2.0
    assert end_time(segs, 3.0) == T0 + 4.5 * H  # 1 h of work by 2.5 h, then 2 h at 1.0
    assert resume_segments(T0, 0.0) == [Segment(T0, 1.0)]


def test_float_hours_give_the_same_run_as_timestamps():
    base = 450_000.0  # an absolute hour, as the simulator counts
    f_segs = resume_segments(base, 0.25, [Segment(base + 2.0, 1.2)])
    t_segs = resume_segments(T0, 0.25, [Segment(T0 + 2 * H, 1.2)])
    for at in (0.1, 1.0, 2.0, 3.7):
        assert work_done_h(f_segs, base + at) == pytest.approx(work_done_h(t_segs, T0 + at * H))
    assert end_time(f_segs, 2.5) - base == pytest.approx((end_time(t_segs, 2.5) - T0) / H)
    assert end_time(f_segs, 2.5) - base == pytest.approx(2.0 + 0.75 * 1.2)  # 1.75 h by 2.0, 0.75 h at 1.2


def test_a_failing_attempt_ends_where_its_fraction_of_work_is_done():
    assert failure_work_h(4.0, None) == 4.0
    assert failure_work_h(4.0, 0.25) == 1.0
    segs = [Segment(T0, 1.0), Segment(T0 + 0.5 * H, 2.0)]
    assert end_time(segs, failure_work_h(4.0, 0.25)) == T0 + 1.5 * H  # 0.5 h, then 0.5 h of work at 2.0


def test_vectorised_forms_agree_with_the_segment_forms():
    rng = np.random.default_rng(7)
    n = 200
    full = rng.uniform(1, 30, n)  # hours the whole job takes at the run's limit
    done = np.where(rng.random(n) < 0.5, rng.uniform(0, 0.8, n), 0.0)  # kept before this run
    ck_h = rng.uniform(0, 0.2, n)
    ran = rng.uniform(0, 20, n)
    checkpointing = rng.random(n) < 0.7
    shares = kept_share(ran, full, done, ck_h, ck_h, checkpointing)
    walls = run_wall_h(full, done, ck_h)
    for i in range(n):
        restore = ck_h[i] if done[i] > 0 else 0.0
        segs = resume_segments(0.0, restore)  # one limit: time factor 1 = the job's run time `full` there
        kept_h = kept_work_h(segs, ran[i], ck_h[i], checkpointing[i])
        expect = min(done[i] + kept_h / full[i], 0.999)
        assert shares[i] == pytest.approx(expect, abs=1e-12)
        assert walls[i] == pytest.approx(end_time(segs, full[i] * (1 - done[i])))
