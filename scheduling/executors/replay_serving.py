"""Inference services in replayed time, for the replay executor: each scaling is kept (`executor.replay_services`),
and every whole hour a service has replicas in a cluster, they serve the hour's actual requests of its rate source
(`scheduling.queue.service_rates`) as the serving model says (`scheduling.models.serving.at_load`): the demand split
evenly over the replicas, each drawing the model's power at its load, the latency percentile at that load, saturated
when the demand reaches the batch cap's throughput. An hour whose rate the source lacks is not served (no row).
"""

from __future__ import annotations

import math

import pandas as pd

from common.timeutil import HOUR, utc
from scheduling.executors.base import (
    SERVICE_PROVISION_COLUMNS,
    SERVICE_PROVISION_FIELDS,
    SERVICE_USAGE_COLUMNS,
    check_window,
    typed_frame,
    typed_values,
)
from scheduling.models.serving import at_load, key_of, serving_model
from scheduling.queue.service_rates import rate_history
from warehouse.db import create_tables, reader, table_exists, writer

SERVICES = "executor.replay_services"
SERVICE_COLUMNS: dict[str, str] = {
    "executor": "VARCHAR NOT NULL",
    "plan_id": "VARCHAR NOT NULL",  # the plan that decided the scaling (its idempotency key with key)
    "key": "VARCHAR NOT NULL",  # tenant/service@cluster
    "scaled_at": "TIMESTAMPTZ NOT NULL",
    **SERVICE_PROVISION_COLUMNS,
    "scale_ref": "VARCHAR NOT NULL",
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS executor;
CREATE TABLE IF NOT EXISTS {SERVICES} (
    {", ".join(f"{name} {kind}" for name, kind in SERVICE_COLUMNS.items())},
    PRIMARY KEY (executor, plan_id, key)
);
"""


class ReplayServing:
    """The services part of a replay executor named `name` (see the module doc)."""

    def __init__(self, name: str, db_path=None, data_dir=None):
        self.name, self.db_path, self.data_dir = name, db_path, data_dir

    def ref(self, plan_id: str, key: str) -> str:
        return f"{self.name}:{plan_id}:{key}:scale"

    def scale(self, key: str, at, *, plan_id: str, provision: dict) -> str:
        """Record the scaling (the same (plan_id, key) again changes nothing and returns the same ref)."""
        missing = [f for f in SERVICE_PROVISION_FIELDS if f not in provision]
        if missing:
            raise ValueError(f"service {key}: the scaling lacks {missing}")
        replicas = provision["replicas"]
        if replicas is None or not math.isfinite(float(replicas)) or int(replicas) < 0:
            raise ValueError(f"service {key}: replicas must be a whole number >= 0, got {replicas!r}")
        row = {f: provision[f] for f in SERVICE_PROVISION_FIELDS}
        row.update(executor=self.name, plan_id=plan_id, key=key, scaled_at=utc(at), scale_ref=self.ref(plan_id, key))
        values = typed_values(row, SERVICE_COLUMNS)
        with writer(self.db_path) as con:
            create_tables(con, DDL)
            con.execute("BEGIN TRANSACTION")
            try:
                done = con.execute(
                    f"SELECT scale_ref FROM {SERVICES} WHERE executor = ? AND plan_id = ? AND key = ?",
                    [self.name, plan_id, key],
                ).fetchone()
                if done is None:
                    con.execute(
                        f"INSERT INTO {SERVICES} ({', '.join(SERVICE_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(SERVICE_COLUMNS))})",
                        values,
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return str(done[0]) if done is not None else self.ref(plan_id, key)

    def scaling_ref(self, plan_id: str, key: str) -> str | None:
        with reader(self.db_path) as con:
            if not table_exists(con, SERVICES):
                return None
            got = con.execute(
                f"SELECT scale_ref FROM {SERVICES} WHERE executor = ? AND plan_id = ? AND key = ?",
                [self.name, plan_id, key],
            ).fetchone()
        return None if got is None else str(got[0])

    def scalings(self) -> pd.DataFrame:
        """Every scaling this executor holds, by time and key."""
        with reader(self.db_path) as con:
            if not table_exists(con, SERVICES):
                return typed_frame([], SERVICE_COLUMNS)
            return con.execute(f"SELECT * FROM {SERVICES} WHERE executor = ? ORDER BY scaled_at, key", [self.name]).df()

    def usage(self, now, since=None) -> pd.DataFrame:
        """SERVICE_USAGE_COLUMNS rows of the whole hours in [since, now) (see the module doc)."""
        since, now = check_window(since, now)
        scalings = self.scalings()
        if scalings.empty:
            return typed_frame([], SERVICE_USAGE_COLUMNS)
        scalings["scaled_at"] = pd.to_datetime(scalings["scaled_at"], utc=True)
        first = scalings["scaled_at"].min().floor("h")
        start = first if since is None else max(since.ceil("h"), first)
        hours = pd.date_range(start, now.floor("h") - HOUR, freq="h") if now.floor("h") > start else []
        if not len(hours):
            return typed_frame([], SERVICE_USAGE_COLUMNS)
        model = serving_model(self.data_dir)
        rows = []
        for _, part in scalings.groupby("key", sort=True):
            part = part.sort_values("scaled_at", kind="mergesort")
            in_force = part.set_index("scaled_at").reindex(hours, method="ffill")
            live = in_force[in_force["replicas"].fillna(0) > 0]
            if live.empty:
                continue
            spec = live.iloc[-1]
            rates = rate_history(spec, live.index.min(), live.index.max() + HOUR, data_dir=self.data_dir,
                                 db_path=self.db_path).set_index("hour_utc")  # fmt: skip
            for hour, s in live.iterrows():
                demand = float(rates["demand_tokens_per_s"].get(hour, float("nan")))
                if not math.isfinite(demand):
                    continue
                n = int(s["replicas"])
                point = at_load(model, key_of(s["curve"]), demand / n, int(s["batch_cap"]))
                rows.append(
                    {
                        "service": f"{s['tenant']}/{s['service_id']}",
                        "tenant": s["tenant"],
                        "service_id": s["service_id"],
                        "hour_utc": hour,
                        "executor": self.name,
                        "cluster": s["cluster"],
                        "plan_id": s["plan_id"],
                        "replicas": n,
                        "gpus": n * int(s["num_gpus"]),
                        "batch_cap": int(s["batch_cap"]),
                        "requests": float(rates["requests_per_s"].get(hour)) * 3600.0,
                        "demand_tokens_per_s": demand,
                        "tokens": point.served_tokens_per_s * n * 3600.0,
                        "energy_kwh": n * point.power_w / 1000.0,
                        "latency_ms": point.latency_ms,
                        "saturated": bool(point.saturated),
                    }
                )
        frame = typed_frame(rows, SERVICE_USAGE_COLUMNS)
        return frame.sort_values(["hour_utc", "service", "cluster"], kind="mergesort").reset_index(drop=True)
