"""Exactly-once scalings of inference services: `plan.service_scalings`, an `action_log.ActionLog` keyed by
(plan_id, job_id), where job_id is ``tenant/service@cluster`` (a service moving to another cluster is two actions:
up there, to 0 here), and what the executors report serving, into `raw.service_usage`.

    record_scalings(plan_id, scalings, executor_of)      # the hour's changes, once per plan (status intent)
    apply_scalings(plan_id, executor)                    # -> {"sent": [...], "reconciled": [...], ...}
    load_service_usage(usage, since, now)                # the executors' served hours of the window

Fail-open: a scaling that failed leaves the service as it was there.
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import utc
from scheduling.executors.action_log import STATUS_COLUMNS, ActionLog
from scheduling.executors.base import (
    SERVICE_PROVISION_COLUMNS,
    SERVICE_PROVISION_FIELDS,
    SERVICE_USAGE_COLUMNS,
    typed_frame,
)
from warehouse.db import create_tables, writer

TABLE = "plan.service_scalings"
COLUMNS: dict[str, str] = {
    "plan_id": "VARCHAR NOT NULL",  # the plan that decided the scaling
    "job_id": "VARCHAR NOT NULL",  # tenant/service@cluster
    "service": "VARCHAR NOT NULL",  # tenant/service_id
    "executor": "VARCHAR NOT NULL",
    "scaled_at": "TIMESTAMPTZ NOT NULL",  # the plan's time
    "from_replicas": "INTEGER",
    **SERVICE_PROVISION_COLUMNS,
    "cluster": "VARCHAR NOT NULL",
    **STATUS_COLUMNS,
}
LOG = ActionLog(
    TABLE,
    COLUMNS,
    "scaled_at",
    lookup=lambda executor, plan_id, key: executor.service_scaling_ref(plan_id, key),
    send=lambda executor, row: executor.scale_service(
        str(row["job_id"]),
        utc(row["scaled_at"]),
        plan_id=row["plan_id"],
        provision={k: row.get(k) for k in SERVICE_PROVISION_FIELDS},
    ),
)

# write the hour's scalings as intents, once per plan
record_scalings = LOG.record
# plan.service_scalings rows (of one plan), ordered by plan and key; empty without the table
read_scalings = LOG.read
# carry out the plan's scalings logged for an executor (`ActionLog.carry_out`)
apply_scalings = LOG.carry_out

USAGE = "raw.service_usage"
# beside what the executor reported: the zone and PUE that value it, and the static counterfactual's hour (the
# service provisioned for its peak in its home region, default batch cap and power limit, serving the same demand)
USAGE_COLUMNS: dict[str, str] = {
    **SERVICE_USAGE_COLUMNS,
    "region": "VARCHAR",
    "zone": "VARCHAR",
    "pue": "DOUBLE",
    "latency_slo_ms": "DOUBLE",
    "static_cluster": "VARCHAR",
    "static_zone": "VARCHAR",
    "static_gpus": "INTEGER",
    "static_tokens": "DOUBLE",
    "static_kwh": "DOUBLE",  # PUE included
    "static_latency_ms": "DOUBLE",
    "static_saturated": "BOOLEAN",
    "_loaded_at": "TIMESTAMPTZ",  # the window's end: loading one window again writes the same rows
}
USAGE_DDL = f"""
CREATE SCHEMA IF NOT EXISTS raw;
CREATE TABLE IF NOT EXISTS {USAGE} (
    {", ".join(f"{name} {kind}" for name, kind in USAGE_COLUMNS.items())},
    PRIMARY KEY (service, cluster, hour_utc)
);
"""


def load_service_usage(usage: pd.DataFrame, since, now, db_path=None) -> int:
    """Replace the window [since, now) of `raw.service_usage` by `usage` (USAGE_COLUMNS): loading a window again
    leaves the table as it was. Returns the rows written."""
    frame = typed_frame(usage.assign(_loaded_at=utc(now)) if len(usage) else [], USAGE_COLUMNS)
    with writer(db_path) as con:
        create_tables(con, USAGE_DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(
                f"DELETE FROM {USAGE} WHERE hour_utc >= ? AND hour_utc < ?",
                [utc(since).to_pydatetime(), utc(now).to_pydatetime()],
            )
            if len(frame):
                con.register("_usage", frame)
                con.execute(f"INSERT INTO {USAGE} BY NAME SELECT * FROM _usage")
                con.unregister("_usage")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return int(len(frame))
