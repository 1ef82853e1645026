"""The carbon ledger recomputed by hand: a warehouse with the real grid rows of three zones, one stored plan and the
executor events of its jobs; every figure of marts.job_runs and marts.carbon_ledger is then worked out again in
Python from the grid rows alone (marts.grid_hourly), hour by hour:

- a run's carbon: its energy in each hour it touches (the draw, PUE included, x the part of the hour it ran) x the
  zone's intensity in that hour, so a run starting at :20 counts 40 minutes of its first hour;
- a moved job's data transfer: its kWh at the mean of the home zone's and the cluster zone's intensity in the hour
  the run starts;
- the run-now counterfactual: the job started at submission in its home zone at the default limit's draw, for the
  planned run-now duration scaled by the attempt's actual / planned run time;
- a run whose power limit changed mid-run: each stretch at its own limit's draw, and its run-now run time from its
  hours at the dispatch limit (each stretch's hours over its run-time factor);
- a job preempted at a checkpoint and resumed: each attempt a partial run over its own hours (the resumed one
  reports `resumed`, not `started`), the counterfactual from the last one, as for a retried job;
- the saving: counterfactual - realized, over every attempt of the job.

The inputs (GPU count, board power, PUE) are the test's own; the plan stores the draw as the planner does (GPUs x
board power x PUE). `energy_by_hour` is the one place that turns a run into kWh per hour."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from scheduling.executors.events import load_events
from scheduling.executors.power_log import record_decisions
from scheduling.executors.replay import ReplayExecutor
from scheduling.output.ledger import LEDGER_SELECT
from scheduling.output.plan_store import StoredPlan, write_plan
from tests.scheduling.executor_samples import plan_id_at
from transforms.runner import build
from warehouse.db import reader
from warehouse.ingest import ingest

T0 = pd.Timestamp("2021-07-15T12:00:00Z")
H = pd.Timedelta(hours=1)
M = pd.Timedelta(minutes=1)
PUE = {"fra-a100": 1.3, "mad-a100": 1.1}
ZONE = {"fra-a100": "DE", "mad-a100": "ES"}
BOARD_KW = {300: 0.300, 400: 0.355}  # per GPU at a power limit (W): what the plan's draw is built from
DEFAULT_LIMIT_W = 400


@dataclass(frozen=True)
class Attempt:
    started: pd.Timestamp
    ended: pd.Timestamp
    outcome: str  # finished, failed, preempted


@dataclass(frozen=True)
class PowerChange:
    at: pd.Timestamp  # a plan hour: the plan that decided it
    limit_w: int
    time_factor: float  # run time at the new limit relative to the dispatch limit


@dataclass(frozen=True)
class Job:
    """One planned job: where and how it was planned, and its attempts."""

    job: str  # tenant/job_id
    cluster: str
    home: str  # home cluster
    gpus: int
    limit_w: int
    submitted: pd.Timestamp
    planned_start: pd.Timestamp
    planned_h: float
    run_now_h: float  # the plan's run-now duration (hours, at home, default limit)
    transfer_kwh: float
    attempts: tuple[Attempt, ...]
    changes: tuple[PowerChange, ...] = ()  # of the last attempt

    def draw_kw(self, limit_w: int | None = None) -> float:
        return self.gpus * BOARD_KW[limit_w or self.limit_w] * PUE[self.cluster]

    def stretches(self, attempt: Attempt) -> list[tuple[pd.Timestamp, pd.Timestamp, int, float]]:
        """(from, to, limit W, time factor) of an attempt: the dispatch limit, then each change."""
        changes = self.changes if attempt is self.attempts[-1] else ()
        starts = [(attempt.started, self.limit_w, 1.0)] + [(c.at, c.limit_w, c.time_factor) for c in changes]
        ends = [c.at for c in changes] + [attempt.ended]
        return [(a, b, w, f) for (a, w, f), b in zip(starts, ends)]

    def run_now_kw(self) -> float:
        return self.gpus * BOARD_KW[DEFAULT_LIMIT_W] * PUE[self.home]


JOBS = (
    # runs at home; starts at 12:20 and ends at 15:45: partial first and last hours
    Job("lab/local", "fra-a100", "fra-a100", 4, 300, T0 - 50 * M, T0, 3.0, 2.6, 0.0,
        (Attempt(T0 + 20 * M, T0 + 3 * H + 45 * M, "finished"),)),
    # moved from DE to ES with 2.5 kWh of data; its run crosses 14:00
    Job("lab/moved", "mad-a100", "fra-a100", 2, 400, T0 - 2 * H, T0 + H, 1.0, 1.0, 2.5,
        (Attempt(T0 + H + 40 * M, T0 + 2 * H + 10 * M, "finished"),)),
    # failed once, then finished: the ledger sums both attempts, the counterfactual takes the last one's run time
    Job("lab/retried", "fra-a100", "fra-a100", 1, 400, T0 - 10 * M, T0, 2.0, 2.0, 0.0,
        (Attempt(T0 + 5 * M, T0 + 35 * M, "failed"), Attempt(T0 + 50 * M, T0 + 2 * H + 20 * M, "finished"))),
    # lowered to 300 W at 13:00 (10 % slower), raised back at 15:00: three stretches at two draws
    Job("lab/recapped", "fra-a100", "fra-a100", 2, 400, T0 - 30 * M, T0, 3.0, 2.5, 0.0,
        (Attempt(T0 + 10 * M, T0 + 3 * H + 25 * M, "finished"),),
        (PowerChange(T0 + H, 300, 1.1), PowerChange(T0 + 3 * H, 400, 1.0))),
    # stopped at a checkpoint at 13:20, resumed from it at 15:00: two partial runs, two hours apart
    Job("lab/paused", "fra-a100", "fra-a100", 2, 400, T0 - 20 * M, T0, 2.0, 3.0, 0.0,
        (Attempt(T0 + 10 * M, T0 + H + 20 * M, "preempted"), Attempt(T0 + 3 * H, T0 + 5 * H, "finished"))),
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ by hand
def hours_of(start: pd.Timestamp, end: pd.Timestamp) -> dict[pd.Timestamp, float]:
    """The hours [start, end) touches, each with the hours of it the window covers."""
    out, hour = {}, start.floor("h")
    while hour < end:
        out[hour] = (min(end, hour + H) - max(start, hour)) / H
        hour += H
    return out


def energy_by_hour(draw_kw: float, start: pd.Timestamp, end: pd.Timestamp) -> dict[pd.Timestamp, float]:
    """kWh drawn in each hour of a run at a constant draw (kW, PUE included)."""
    return {hour: draw_kw * share for hour, share in hours_of(start, end).items()}


def kg_at(ci: dict, zone: str, kwh_by_hour: dict[pd.Timestamp, float]) -> float:
    return sum(kwh * ci[(zone, hour)] for hour, kwh in kwh_by_hour.items()) / 1000.0


def attempt_kwh_by_hour(job: Job, attempt: Attempt) -> list[dict[pd.Timestamp, float]]:
    """kWh per hour of each stretch of an attempt, at its limit's draw."""
    return [energy_by_hour(job.draw_kw(w), a, b) for a, b, w, _ in job.stretches(attempt)]


def attempt_kg(ci: dict, job: Job, attempt: Attempt) -> float:
    run = sum(kg_at(ci, ZONE[job.cluster], part) for part in attempt_kwh_by_hour(job, attempt))
    start_hour = attempt.started.floor("h")
    both_ends = 0.5 * (ci[(ZONE[job.home], start_hour)] + ci[(ZONE[job.cluster], start_hour)])
    return run + job.transfer_kwh * both_ends / 1000.0


def counterfactual_kg(ci: dict, job: Job) -> float:
    last = job.attempts[-1]
    at_dispatch_limit = sum(((b - a) / H) / f for a, b, _, f in job.stretches(last))
    hours = job.run_now_h * at_dispatch_limit / job.planned_h
    end = job.submitted + pd.Timedelta(microseconds=round(hours * 3600e6))  # kept to the microsecond
    return kg_at(ci, ZONE[job.home], energy_by_hour(job.run_now_kw(), job.submitted, end))


# ------------------------------------------------------------------------------------------------ the warehouse
def _plan() -> None:
    rows = []
    for job in JOBS:
        planned_end = job.planned_start + pd.Timedelta(hours=job.planned_h)
        rows.append(
            {
                "job_id": job.job,
                "cluster": job.cluster,
                "region": job.cluster.split("-")[0],
                "zone": ZONE[job.cluster],
                "start_time": job.planned_start,
                "end_time": planned_end,
                "submit_time": job.submitted,
                "deadline": T0 + 8 * H,
                "power_limit_w": float(job.limit_w),
                "draw_kw": job.draw_kw(),
                "transfer_kwh": job.transfer_kwh,
                "home_cluster": job.home,
                "home_zone": ZONE[job.home],
                "run_now_kw": job.run_now_kw(),
                "run_now_duration_h": job.run_now_h,
                "expected_energy_kwh": job.draw_kw() * job.planned_h + job.transfer_kwh,
                "expected_kgco2e": 1.0,
                "status": "assigned",
            }
        )
    write_plan(StoredPlan(plan_time=T0, policy="carbon", forecast_version=None, assignments=pd.DataFrame(rows)))


def _events(plan_id: str) -> pd.DataFrame:
    rows = []
    for job in JOBS:
        tenant, job_id = job.job.split("/")
        for n, attempt in enumerate(job.attempts, start=1):
            base = {"tenant": tenant, "job_id": job_id, "planner_job_id": job.job, "plan_id": plan_id, "attempt": n}
            base |= {"cluster": job.cluster, "node": "node-0", "executor_ref": f"{job_id}-{n}"}
            rows.append(base | {"event": "dispatched", "event_time": attempt.started})
            resumed = n > 1 and job.attempts[n - 2].outcome == "preempted"
            rows.append(base | {"event": "resumed" if resumed else "started", "event_time": attempt.started})
            for change in job.changes if attempt is job.attempts[-1] else ():
                rows.append(base | {"event": "power_changed", "event_time": change.at, "power_limit_w": change.limit_w})
            rows.append(base | {"event": attempt.outcome, "event_time": attempt.ended})
    return pd.DataFrame(rows)


def _power_changes(run_plan_id: str, db: Path) -> None:
    """plan.power_changes as the deciding plans record them (each at its plan hour)."""
    for job in JOBS:
        for change in job.changes:
            row = {"job_id": job.job, "plan_id": run_plan_id, "attempt": len(job.attempts), "cluster": job.cluster,
                   "to_limit_w": float(change.limit_w), "time_factor": change.time_factor,
                   "draw_kw": job.draw_kw(change.limit_w), "reason": "carbon", "changed": True}  # fmt: skip
            record_decisions(plan_id_at(change.at), pd.DataFrame([row]), {job.cluster: ReplayExecutor(db_path=db)}, db)


@pytest.fixture(scope="module")
def ledger_warehouse(tmp_path_factory, data_dir) -> Path:
    root = tmp_path_factory.mktemp("ledger_recomputed")
    db = root / "warehouse.duckdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WAREHOUSE_PATH", str(db))
        ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
        assert build(select="+grid_hourly", warehouse_path=db, target_path=root / "target").ok
        _plan()
        with reader(db) as con:
            (plan_id,) = con.execute("SELECT plan_id FROM plan.plans").fetchone()
        _power_changes(plan_id, db)
        load_events(_events(plan_id), "replay", T0, T0 + 8 * H, db_path=db)
        result = build(select=list(LEDGER_SELECT), warehouse_path=db, target_path=root / "target")
        assert result.ok, result.output[-3000:]
    return db


@pytest.fixture(scope="module")
def ci(ledger_warehouse) -> dict[tuple[str, pd.Timestamp], float]:
    """(zone, hour) -> the actual intensity, gCO2e/kWh: the grid rows the ledger values against."""
    with reader(ledger_warehouse) as con:
        rows = con.execute(
            "SELECT region, hour_utc, carbon_intensity_direct_gco2_per_kwh FROM marts.grid_hourly "
            "WHERE region IN ('DE', 'ES') AND hour_utc BETWEEN ? AND ?",
            [T0 - 4 * H, T0 + 8 * H],
        ).fetchall()
    out = {(zone, pd.Timestamp(hour).tz_convert("UTC")): value for zone, hour, value in rows}
    assert len(out) == 2 * 13 and all(v and v > 0 for v in out.values())
    return out


def test_the_grid_differs_between_the_hours_and_zones_the_jobs_touch(ci):
    """Otherwise a wrong hour weighting or a transfer at one end could give the same number."""
    for zone in ("DE", "ES"):
        values = [ci[(zone, T0 + h * H)] for h in range(-2, 5)]
        assert len(set(values)) == len(values), (zone, values)
    assert ci[("DE", T0 + H)] != ci[("ES", T0 + H)]


def test_each_attempt_is_valued_hour_by_hour_at_its_zone_with_the_transfer_at_both_ends(ledger_warehouse, ci):
    with reader(ledger_warehouse) as con:
        rows = con.execute(
            "SELECT tenant || '/' || job_id, attempt, outcome, energy_source, energy_kwh, realized_kgco2e "
            "FROM marts.job_runs"
        ).fetchall()
    got = {(job, attempt): rest for job, attempt, *rest in rows}
    assert sorted(got) == sorted((job.job, n) for job in JOBS for n in range(1, len(job.attempts) + 1))
    for job in JOBS:
        for n, attempt in enumerate(job.attempts, start=1):
            outcome, source, kwh, kg = got[(job.job, n)]
            assert (outcome, source) == (attempt.outcome, "power_model")
            run_kwh = sum(sum(part.values()) for part in attempt_kwh_by_hour(job, attempt))
            assert kwh == pytest.approx(run_kwh + job.transfer_kwh, rel=1e-9), job.job
            assert kg == pytest.approx(attempt_kg(ci, job, attempt), rel=1e-9), (job.job, n)


def test_the_ledger_sums_the_attempts_against_the_run_now_counterfactual(ledger_warehouse, ci):
    with reader(ledger_warehouse) as con:
        rows = con.execute(
            "SELECT tenant || '/' || job_id, outcome, attempts, realized_kgco2e, counterfactual_kgco2e, saving_kgco2e, "
            "saving_pct FROM marts.carbon_ledger"
        ).fetchall()
    ledger = {job: rest for job, *rest in rows}
    assert sorted(ledger) == sorted(job.job for job in JOBS)
    for job in JOBS:
        outcome, attempts, realized, counterfactual, saving, saving_pct = ledger[job.job]
        expected_realized = sum(attempt_kg(ci, job, a) for a in job.attempts)
        expected_counterfactual = counterfactual_kg(ci, job)
        assert (outcome, attempts) == ("finished", len(job.attempts))
        assert realized == pytest.approx(expected_realized, rel=1e-9), job.job
        assert counterfactual == pytest.approx(expected_counterfactual, rel=1e-9), job.job
        assert saving == pytest.approx(expected_counterfactual - expected_realized, rel=1e-9, abs=1e-12), job.job
        assert saving_pct == pytest.approx(100 * (1 - expected_realized / expected_counterfactual), rel=1e-9)
