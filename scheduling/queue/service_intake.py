"""Inference services into the queue: `queue.services`, one row per (tenant, service_id), through the same intake
rules as jobs (`scheduling.queue.intake`).

    report = submit_service_file("services.yaml", tenant="ml", as_of="2021-07-15T12:00Z")   # -> IntakeReport
    frame = list_services()                                                                  # queue.services

A file holds a top-level `services:` list (YAML or JSON; fields: `service_spec.SERVICE_FIELD_DOCS`). Each entry is
parsed and checked (`service_spec.check_service`: the serving data, the fleet's regions, the rate source; a relative
`file:` source is stored as an absolute path); an id
given twice in one file is refused for every occurrence. A new service is **accepted**, the same spec again is
**unchanged**, a different one is **replaced** with `replace=True` and **rejected** otherwise; every rejected entry
puts one row per bad field into `quarantine.rejected_rows` (table_name `queue.services`) naming the service and the
field, and the good ones land all the same, in one transaction. Submitting the same file again rewrites nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd

from forecasting.data import SERVEGEN_RATES
from scheduling.models.serving import fit_serving_model
from scheduling.queue.files import read_job_file, read_text
from scheduling.queue.intake import IntakeReport, Outcome, _as_of, _batch_id, _quarantine, fleet_facts
from scheduling.queue.service_spec import ServiceSpec, check_service, parse_service, service_label
from scheduling.queue.spec import FieldError, JobSpecError
from warehouse.config import data_dir as configured_data_dir
from warehouse.db import Rejection, create_tables, reader, table_exists, writer

SERVICES = "queue.services"
# the example services (docs/examples/services.yaml): what `make run` and the loop benchmark submit
EXAMPLE_SERVICES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "services.yaml"
COLUMNS: dict[str, str] = {
    "tenant": "VARCHAR NOT NULL",
    "service_id": "VARCHAR NOT NULL",
    "submitted_at": "TIMESTAMPTZ NOT NULL",
    "model": "VARCHAR NOT NULL",
    "gpu_models": "VARCHAR[] NOT NULL",
    "latency_slo_ms": "DOUBLE NOT NULL",
    "latency_kind": "VARCHAR NOT NULL",
    "task": "VARCHAR NOT NULL",
    "home_region": "VARCHAR NOT NULL",
    "allowed_regions": "VARCHAR[] NOT NULL",
    "min_replicas": "INTEGER NOT NULL",
    "rate_source": "VARCHAR NOT NULL",
    "rate_scale": "DOUBLE NOT NULL DEFAULT 1.0",
    "spec_hash": "VARCHAR NOT NULL",
    "created_from": "VARCHAR NOT NULL",
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS queue;
CREATE TABLE IF NOT EXISTS {SERVICES} (
    {", ".join(f"{c} {t}" for c, t in COLUMNS.items())},
    PRIMARY KEY (tenant, service_id)
);
ALTER TABLE {SERVICES} ADD COLUMN IF NOT EXISTS rate_scale DOUBLE DEFAULT 1.0;
"""


def servegen_models(data_dir=None) -> tuple[str, ...]:
    """The model names ServeGen's rate file holds (the `servegen:` rate sources)."""
    path = Path(data_dir or configured_data_dir()) / SERVEGEN_RATES
    if not path.is_file():
        return ()
    return tuple(sorted(pd.read_csv(path, usecols=["model"])["model"].unique()))


def submit_service_file(
    path, *, tenant=None, replace: bool = False, as_of=None, fleet=None, db_path=None, data_dir=None
) -> IntakeReport:
    """Submit every service of a YAML/JSON file (see the module doc); JobFileError when the file as a whole cannot
    be read (nothing is written then)."""
    path = Path(path)
    raws = read_job_file(path, key="services")
    as_of_ts = None if as_of is None or str(as_of).strip() == "" else _as_of(as_of)
    source = str(path.resolve())
    batch_id = _batch_id(source, read_text(path), tenant, replace, as_of_ts)
    serving = fit_serving_model(data_dir)
    regions = set(fleet_facts(fleet, data_dir=data_dir).regions)
    rates = servegen_models(data_dir)
    specs: list[ServiceSpec | None] = []
    errors: list[list[FieldError]] = []
    wheres = []
    for raw in raws:
        where = f"{service_label(named_raw(raw.data, tenant))} ({raw.where})"
        wheres.append(where)
        if raw.error:
            specs.append(None)
            errors.append([FieldError(None, None, raw.error)])
            continue
        try:
            spec = parse_service(raw.data, where=where, default_tenant=tenant, default_submitted_at=as_of_ts)
        except JobSpecError as exc:  # also what the checks find in the fields that did parse
            bad = {e.field for e in exc.errors}
            checked = check_service(raw.data, serving, regions, rates, path.parent, skip=bad) if raw.data else []
            specs.append(None)
            errors.append([*exc.errors, *checked])
            continue
        found = check_service(spec, serving, regions, rates, path.parent)
        specs.append(spec if found else with_absolute_rate_file(spec, path.parent))
        errors.append(found)
    twice = Counter(s.planner_id for s in specs if s is not None)
    for i, spec in enumerate(specs):
        if spec is not None and twice[spec.planner_id] > 1:
            errors[i].append(FieldError("service_id", spec.service_id, "is given more than once in this file"))
    outcomes, rejections = [], []
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            for i, (raw, spec) in enumerate(zip(raws, specs)):
                status = None if errors[i] else _store(con, spec, replace, errors[i], f"file:{path.name}")
                label = spec.planner_id if spec is not None else service_label(named_raw(raw.data, tenant))[8:]
                if errors[i]:
                    record = raw.data if isinstance(raw.data, dict) else {"value": raw.data}
                    for e in errors[i]:
                        rejections.append(
                            Rejection(
                                e.message(wheres[i]),
                                str(path),
                                raw.row_number,
                                e.field,
                                None if e.value is None else str(e.value),
                                record,
                            )  # fmt: skip
                        )
                    detail = [{"field": e.field, "value": e.value, "reason": e.reason} for e in errors[i]]
                    outcomes.append(Outcome(label, "rejected", raw.where, raw.row_number, [], detail))
                else:
                    outcomes.append(Outcome(label, status, raw.where, raw.row_number))
            _quarantine(con, batch_id, source, rejections, as_of_ts, table=SERVICES)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return IntakeReport(source, batch_id, outcomes)


def with_absolute_rate_file(spec: ServiceSpec, base_dir: Path) -> ServiceSpec:
    """`spec` with a relative `file:` rate source made absolute (it is checked against the submitted file's folder;
    the loop reads it from anywhere)."""
    kind, _, rest = spec.rate_source.partition(":")
    if kind != "file" or Path(rest).is_absolute():
        return spec
    return replace(spec, rate_source=f"file:{(base_dir / rest).resolve()}")


def named_raw(data, tenant) -> dict:
    """A raw entry with the submission's tenant where it names none (for its label)."""
    return {**data, "tenant": data.get("tenant") or tenant} if isinstance(data, dict) else {}


def _store(con, spec: ServiceSpec, replace: bool, errors: list, created_from: str) -> str | None:
    """Insert, keep or replace the service's row; a refused replacement appends its error (returns None)."""
    row = con.execute(
        f"SELECT spec_hash FROM {SERVICES} WHERE tenant = ? AND service_id = ?", [spec.tenant, spec.service_id]
    ).fetchone()
    if row is not None and row[0] == spec.spec_hash():
        return "unchanged"
    if row is not None and not replace:
        errors.append(
            FieldError("service_id", spec.service_id, "a different spec is stored under this id; pass --replace")
        )
        return None
    values = {**spec.user_values(), "spec_hash": spec.spec_hash(), "created_from": created_from}
    con.execute(f"DELETE FROM {SERVICES} WHERE tenant = ? AND service_id = ?", [spec.tenant, spec.service_id])
    con.execute(
        f"INSERT INTO {SERVICES} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})",
        [values[c] for c in COLUMNS],
    )
    return "accepted" if row is None else "replaced"


def list_services(db_path=None) -> pd.DataFrame:
    """Every stored service (COLUMNS), by tenant and id; empty when none was ever submitted."""
    with reader(db_path) as con:
        if not table_exists(con, SERVICES):
            return pd.DataFrame(columns=list(COLUMNS))
        return con.execute(f"SELECT * FROM {SERVICES} ORDER BY tenant, service_id").df()
