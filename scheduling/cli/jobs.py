"""Commands `jobs submit|list|show|cancel|intake-staging|from-trace` and `services submit|list`: the queue
(scheduling/queue).

    python -m scheduling jobs submit docs/examples/jobs.yaml --as-of 2021-07-15T12:00Z [--tenant T] [--replace]
    python -m scheduling jobs list [--state queued] [--tenant T]
    python -m scheduling jobs show ml-team/resnet50-a [--json]
    python -m scheduling jobs cancel resnet50-a --tenant ml-team
    python -m scheduling jobs intake-staging --as-of 2021-07-15T12:00Z      # queue.submissions -> queue.jobs
    python -m scheduling jobs from-trace --day 2021-07-15 --n 300 --out var/demo-jobs.yaml
    python -m scheduling services submit docs/examples/services.yaml --as-of 2021-07-15T00:00Z
    python -m scheduling services list

With --json exactly one JSON document goes to stdout. Exit codes: 0 done; 1 some jobs were rejected (the others
landed; the rejected ones are in quarantine.rejected_rows); 2 nothing done (a file that cannot be read, a bad
argument, an unknown job, a state change that is not allowed).
"""

from __future__ import annotations

import json
import sys

import pandas as pd

from common.jsonutil import to_jsonable
from common.timeutil import iso_z, parse_time
from scheduling.domain.fleet import load_fleet
from scheduling.queue import store
from scheduling.queue.intake import IntakeReport, fleet_facts, intake_staging, submit_file
from scheduling.queue.service_intake import list_services, submit_service_file
from scheduling.queue.spec import STATES
from scheduling.queue.trace import write_trace_file


def register(subparsers) -> None:
    register_services(subparsers)
    jobs = subparsers.add_parser("jobs", help="the job queue: submit, list, show, cancel jobs")
    sub = jobs.add_subparsers(dest="jobs_command", required=True)

    p = sub.add_parser(
        "submit",
        help="submit the jobs of a YAML/JSON/CSV file",
        description="Parse, check (against the fleet) and store every job of FILE in queue.jobs; rejected jobs go "
        "to quarantine.rejected_rows with the reason. The same job again is a no-op.",
    )
    p.add_argument("file", help="a .yaml/.yml (top-level `jobs:` list), .json or .csv job file")
    p.add_argument("--tenant", default=None, help="tenant of the jobs that name none (a job naming another fails)")
    p.add_argument("--replace", action="store_true", help="replace a stored job whose spec differs, while queued")
    p.add_argument(
        "--as-of",
        default=None,
        help="submission time of jobs without submitted_at (required when a job lacks it; never the wall clock)",
    )
    _common(p, fleet=True)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("list", help="list queued jobs")
    p.add_argument("--state", choices=STATES, default=None)
    p.add_argument("--tenant", default=None)
    _common(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="a job's spec, state history and plan decisions")
    p.add_argument("id", help="tenant/job_id, or job_id (with --tenant when several tenants use it)")
    p.add_argument("--tenant", default=None)
    _common(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "cancel",
        help="cancel a job",
        description="A queued or planned job is cancelled at once; a dispatched or running one is marked "
        "(cancel_requested_at) and its executor stops it and confirms.",
    )
    p.add_argument("id")
    p.add_argument("--tenant", default=None)
    p.add_argument("--as-of", default=None, help="time of the cancellation (default: now, UTC)")
    _common(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("intake-staging", help="move the rows of queue.submissions into queue.jobs")
    p.add_argument("--as-of", default=None, help="submission time of rows without submitted_at")
    p.add_argument("--replace", action="store_true")
    _common(p, fleet=True)
    p.set_defaults(func=cmd_intake_staging)

    p = sub.add_parser("from-trace", help="write trace-derived demo jobs as an intake file")
    p.add_argument("--day", required=True, help="UTC day the jobs arrive on, e.g. 2021-07-15")
    p.add_argument("--n", type=int, default=300, help="number of jobs (default 300)")
    p.add_argument("--out", required=True, help="the YAML file to write")
    p.add_argument("--seed", type=int, default=None, help="trace seed (default: the day as yyyymmdd)")
    p.add_argument("--fleet", default=None, help="fleet YAML (default scheduling/domain/fleet.yaml)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_from_trace)


def register_services(subparsers) -> None:
    services = subparsers.add_parser("services", help="inference services in the queue: submit, list")
    sub = services.add_subparsers(dest="services_command", required=True)
    p = sub.add_parser(
        "submit",
        help="submit the services of a YAML/JSON file",
        description="Parse, check (against the serving data, the fleet's regions and the rate source) and store every "
        "service of FILE in queue.services; rejected ones go to quarantine.rejected_rows with the reason.",
    )
    p.add_argument("file", help="a .yaml/.yml (top-level `services:` list) or .json file")
    p.add_argument("--tenant", default=None, help="tenant of the services that name none")
    p.add_argument("--replace", action="store_true", help="replace a stored service whose spec differs")
    p.add_argument("--as-of", default=None, help="submission time of services without submitted_at")
    _common(p, fleet=True)
    p.set_defaults(func=cmd_services_submit)
    p = sub.add_parser("list", help="list the stored services")
    _common(p)
    p.set_defaults(func=cmd_services_list)


def cmd_services_submit(args) -> int:
    try:
        fleet = load_fleet(args.fleet, data_dir=args.data_dir) if args.fleet else None
        report = submit_service_file(
            args.file, tenant=args.tenant, replace=args.replace, as_of=args.as_of, fleet=fleet, db_path=args.db,
            data_dir=args.data_dir,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    return _report(report, args.json, "service")


def cmd_services_list(args) -> int:
    frame = list_services(db_path=args.db)
    if args.json:
        _print_json(frame.to_dict(orient="records"))
        return 0
    rows = [
        (f"{r.tenant}/{r.service_id}", r.model, ",".join(r.gpu_models) or "any",
         f"{r.latency_slo_ms:g} ms {r.latency_kind}", r.home_region, ",".join(r.allowed_regions) or "any",
         r.min_replicas, r.rate_source)
        for r in frame.itertuples(index=False)
    ]  # fmt: skip
    _table(["service", "model", "gpus", "target", "home", "allowed", "min", "rate source"], rows)
    print(f"{len(rows)} service(s)")
    return 0


def _common(p, fleet: bool = False) -> None:
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    if fleet:
        p.add_argument("--fleet", default=None, help="fleet YAML to check jobs against (default: the fleet file)")
        p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _print_json(value) -> None:
    print(json.dumps(to_jsonable(value), indent=2, sort_keys=True, ensure_ascii=False))


# ------------------------------------------------------------------------------------------------ submit
def cmd_submit(args) -> int:
    try:
        facts = fleet_facts(fleet_path=args.fleet, data_dir=args.data_dir)
        report = submit_file(
            args.file,
            tenant=args.tenant,
            replace=args.replace,
            as_of=args.as_of,
            facts=facts,
            created_from=f"cli:jobs submit {args.file}",
            db_path=args.db,
            data_dir=args.data_dir,
        )
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    return _report(report, args.json)


def cmd_intake_staging(args) -> int:
    try:
        facts = fleet_facts(fleet_path=args.fleet, data_dir=args.data_dir)
        report = intake_staging(as_of=args.as_of, facts=facts, replace=args.replace, db_path=args.db)
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    return _report(report, args.json)


def _report(report: IntakeReport, as_json: bool, noun: str = "job") -> int:
    if as_json:
        _print_json(report.to_dict())
    else:
        counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
        print(f"{counts}  (batch {report.batch_id})")
        rows = []
        for o in report.outcomes:
            if o.status == "rejected":
                for e in o.errors:
                    got = "" if e["value"] is None else f" (got {str(e['value'])[:60]!r})"
                    rows.append((o.status, o.job, o.where, f"{e['field']}: {e['reason']}{got}"))
            else:
                rows.append((o.status, o.job, o.where, ("flags: " + ", ".join(o.flags)) if o.flags else ""))
        _table(["status", noun, "where", "detail"], rows)
        if report.rejected:
            print(f"{len(report.rejected)} {noun}(s) rejected; see quarantine.rejected_rows (batch {report.batch_id})")
    return 1 if report.rejected else 0


def _table(header: list[str], rows: list[tuple]) -> None:
    widths = [max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(header)]
    widths[-1] = 0
    print("  ".join(h.upper().ljust(w) for h, w in zip(header, widths)).rstrip())
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())


# ------------------------------------------------------------------------------------------------ list / show
def cmd_list(args) -> int:
    try:
        frame = store.list_jobs(state=args.state, tenant=args.tenant, db_path=args.db)
    except ValueError as exc:
        return _fail(str(exc))
    if args.json:
        _print_json({"jobs": frame.to_dict(orient="records")})
        return 0
    rows = [
        (
            f"{r.tenant}/{r.job_id}",
            r.state,
            iso_z(r.submitted_at),
            f"{r.gpus}x{r.gpu_milli}",
            r.job_type,
            r.home_region,
            iso_z(r.deadline) if _given(r.deadline) else "-",
            ",".join(r.flags or []),
        )
        for r in frame.itertuples(index=False)
    ]
    _table(["job", "state", "submitted_at", "gpus", "job_type", "home", "deadline", "flags"], rows)
    print(f"{len(rows)} job(s)")
    return 0


def _given(value) -> bool:
    return value is not None and not pd.isna(value)


def cmd_show(args) -> int:
    try:
        doc = store.show_job(args.id, tenant=args.tenant, db_path=args.db)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return _fail(str(exc))
    if args.json:
        _print_json(doc)
        return 0
    print(f"job {doc['job']}")
    for key, value in {**doc["spec"], **doc["system"]}.items():
        if value is None or value == []:
            continue
        shown = iso_z(value) if hasattr(value, "tzinfo") and hasattr(value, "year") else value
        print(f"  {key}: {shown}")
    print("history:")
    for h in doc["history"]:
        move = h["to_state"] if h["from_state"] in (None, h["to_state"]) else f"{h['from_state']} -> {h['to_state']}"
        extra = "; ".join(str(x) for x in (h["reason"], h["source"]) if x)
        print(f"  {h['seq']:>3}  {iso_z(h['changed_at'])}  {h['event']:<16} {move}" + (f"  ({extra})" if extra else ""))
    print(f"plan decisions ({len(doc['assignments'])} assignment(s), {len(doc['unplaced'])} unplaced):")
    for a in doc["assignments"]:
        print(
            f"  {a['plan_id']}: {a['cluster']} ({a['region']}) node {a.get('node')} "
            f"{iso_z(a['start_time'])} -> {iso_z(a['end_time'])}, {a['expected_kgco2e']:.3f} kgCO2e"
        )
    for u in doc["unplaced"]:
        print(f"  {u['plan_id']}: unplaced ({u['reason']})")
    for e in doc["explanations"]:
        print(f"  {e['plan_id']}: {e['text'] or ''}".rstrip())
    return 0


# ------------------------------------------------------------------------------------------------ cancel
def cmd_cancel(args) -> int:
    try:
        at = parse_time(args.as_of, "--as-of") if args.as_of else pd.Timestamp.now(tz="UTC").floor("s")
        out = store.cancel_job(args.id, tenant=args.tenant, at=at, source="cli:jobs cancel", db_path=args.db)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return _fail(str(exc))
    if args.json:
        _print_json(out)
    elif out["state"] == "cancelled":
        print(f"{out['job']}: cancelled" + ("" if out["changed"] else " (already)"))
    else:
        print(
            f"{out['job']}: {out['state']}; cancellation requested at {iso_z(out['cancel_requested_at'])} "
            "(its executor stops it and confirms)"
        )
    return 0


# ------------------------------------------------------------------------------------------------ from-trace
def cmd_from_trace(args) -> int:
    if args.n <= 0:
        return _fail(f"--n must be positive, got {args.n}")
    try:
        day = parse_time(args.day, "--day")
        fleet = load_fleet(args.fleet, data_dir=args.data_dir)
        out = write_trace_file(args.out, day, args.n, fleet, seed=args.seed, data_dir=args.data_dir)
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    if args.json:
        _print_json(out)
    else:
        print(f"{out['jobs']} jobs of {out['day']} (seed {out['seed']}) written to {out['path']}")
    return 0
