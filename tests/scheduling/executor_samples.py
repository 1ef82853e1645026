"""Dispatch items for the executor tests: the assignments of one plan hour with the jobs' payload columns."""

from __future__ import annotations

import pandas as pd

PLAN_TIME = pd.Timestamp("2021-07-15T12:00Z")


def plan_id_at(plan_time=PLAN_TIME, policy: str = "priority") -> str:
    return f"{policy}@{pd.Timestamp(plan_time).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def sample_items(n: int = 20, plan_time=PLAN_TIME, prefix: str = "job", tenants=("acme", "globex")) -> pd.DataFrame:
    """`n` jobs starting at `plan_time` on two clusters, shared and whole-GPU, 1-4 h estimates."""
    t0 = pd.Timestamp(plan_time)
    rows = []
    for i in range(n):
        cluster, region = (("usw-t4", "us-west"), ("eun-v100m32", "eu-north"))[i % 2]
        hours = 1.0 + (i % 4)
        shared = i % 3 == 0
        tenant = tenants[i % len(tenants)]
        rows.append(
            dict(
                job_id=f"{tenant}/{prefix}-{i:04d}",
                cluster=cluster,
                region=region,
                node=f"{cluster}/node-{i % 5:02d}",
                gpu_devices="0" if shared else "0,1",
                gpu_milli=500 if shared else 1000,
                gpu_count=1 if shared else 2,
                start_time=t0,
                end_time=t0 + pd.Timedelta(hours=hours),
                power_limit_w=200.0 + i,
                expected_energy_kwh=1.0 + i,
                expected_kgco2e=0.25 + 0.01 * i,
                priority=0.5,
                cpu_milli=4000,
                memory_mib=16384,
                status="dispatched",
                tenant=tenant,
                queue_job_id=f"{prefix}-{i:04d}",
                image="registry.example/train:1.0",
                command=f"python train.py --job {i}",
                checkpoint_interval_min=30,
                max_retries=2,
                attempt=1,
                est_duration_h=hours,
            )
        )
    return pd.DataFrame(rows)


def crash_mid_change_then_reconcile(ctx, executor, db, plan, pending, decided: int) -> None:
    """Kill the hour's power-change step right after the executor took the first change, then run the dispatch step
    twice: the first run reconciles that change and sends the rest, the second skips them all (none is made twice)."""
    import pytest

    from scheduling import loop
    from scheduling.executors.power_log import apply_power_changes, read_changes

    def crash(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after the executor took the first change")

    with pytest.raises(KeyboardInterrupt):
        apply_power_changes(ctx.plan_id, executor, db, _fault=crash)
    first, again = (loop.dispatch_plan(ctx, plan, pending)["power"] for _ in range(2))
    assert (first["reconciled"], first["sent"], first["failed"]) == (1, decided - 1, {})
    assert (again["skipped"], again["sent"], again["reconciled"]) == (decided, 0, 0)
    assert set(read_changes(ctx.plan_id, db)["status"]) == {"sent"}
