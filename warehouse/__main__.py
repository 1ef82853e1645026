"""Command line: `python -m warehouse {ingest,sql,status,catalog}`."""

from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate

from warehouse import catalog
from warehouse.db import init_catalog, reader
from warehouse.ingest import ingest, summarize
from warehouse.loaders import all_sources
from warehouse.status import table_status


def _cmd_ingest(args: argparse.Namespace) -> int:
    if args.list:
        for name, source in all_sources().items():
            print(f"{name:28s} {source.group:13s} {source.description}")
        return 0
    if not args.all and not args.source:
        print("ingest: give --all or --source NAME (see --list)", file=sys.stderr)
        return 2
    results = ingest(None if args.all else args.source, progress=not args.json)
    summary = summarize(results)
    if args.json:
        print(json.dumps({"tables": summary}, indent=2))
    else:
        print(tabulate(summary, headers="keys", intfmt=","))
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    with reader() as con:
        cursor = con.execute(args.query)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        rows = cursor.fetchall()
    if args.json:
        print(json.dumps([dict(zip(columns, row)) for row in rows], default=str, indent=2))
    else:
        print(tabulate(rows, headers=columns, intfmt=","))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    status = table_status(breakdown=args.json)
    if args.json:
        print(json.dumps({"tables": status}, indent=2))
    else:
        print(tabulate(status, headers="keys", intfmt=","))
    return 0


def _cmd_catalog(args: argparse.Namespace) -> int:
    """The shared-catalog commands: one JSON document on stdout; exit 2 on a configuration error."""
    target = None
    try:
        target = catalog.from_env()
        if args.catalog_command == "describe":
            out = catalog.describe(target)
        elif args.catalog_command == "statements":
            out = {
                "mode": target.mode,
                "database": catalog.describe(target)["database"],
                "statements": catalog.redacted_statements(target, read_only=args.read_only),
            }
        elif args.catalog_command == "init":
            out = init_catalog(target)
        else:
            out = {"mode": target.mode, "installed": catalog.install_extensions(target)}
    except catalog.CatalogConfigError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    except Exception as exc:  # noqa: BLE001 - duckdb errors while installing: redact, report, fail
        print(json.dumps({"error": catalog.redact(f"{type(exc).__name__}: {exc}", target)}))
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warehouse", description="The DuckDB warehouse.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ingest", help="load file sources (and cached live feeds) into raw.*")
    p.add_argument("--all", action="store_true", help="every source")
    p.add_argument("--source", action="append", metavar="NAME", help="one source (repeatable)")
    p.add_argument("--list", action="store_true", help="list the sources and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_ingest)
    p = sub.add_parser("sql", help="run a read-only query")
    p.add_argument("query")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_sql)
    p = sub.add_parser("status", help="row counts and time spans per table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("catalog", help="where the warehouse lives: the local file or a shared catalog (JSON)")
    catalog_sub = p.add_subparsers(dest="catalog_command", required=True)
    catalog_sub.add_parser("describe", help="the configured warehouse target (secrets redacted)")
    statements = catalog_sub.add_parser("statements", help="the connect statements (secrets redacted)")
    statements.add_argument("--read-only", action="store_true")
    catalog_sub.add_parser("install-extensions", help="install the DuckDB extensions the target needs")
    catalog_sub.add_parser("init", help="create the warehouse (lake catalog, schemas, bookkeeping tables) once")
    p.set_defaults(func=_cmd_catalog)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
