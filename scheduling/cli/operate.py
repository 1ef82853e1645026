"""Commands of the operating loop: `ledger` (what really ran, against running every job at once).

python -m scheduling ledger [--from 2021-07-15] [--to 2021-07-17] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from common.jsonutil import to_jsonable
from scheduling.output.ledger import ledger, write_ledger_report


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ledger",
        help="realized kgCO2e against the run-now counterfactual (from marts.carbon_ledger)",
        description="Sum the carbon ledger of the jobs submitted in [--from, --to): realized and run-now kgCO2e, the "
        "saving, deadlines met, then per tenant, region and day; write the HTML ledger with its charts.",
    )
    p.add_argument("--from", dest="start", default=None, help="first submission time (UTC), inclusive")
    p.add_argument("--to", dest="end", default=None, help="last submission time (UTC), exclusive")
    p.add_argument("--out", default=None, help="report folder (default var/reports/ledger/<period>)")
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=cmd_ledger)


def cmd_ledger(args: argparse.Namespace) -> int:
    book = ledger(args.start, args.end, db_path=args.db)
    index = write_ledger_report(book, args.out)
    if args.json:
        print(json.dumps(to_jsonable({**book.to_dict(), "report": str(index)}), indent=2))
        return 0
    print(tabulate([book.totals], headers="keys", floatfmt=".3f"))
    for key, frame in book.rollups.items():
        print(f"\nper {key}")
        print(tabulate(frame, headers="keys", showindex=False, floatfmt=".3f"))
    print(f"\nledger: {index}")
    return 0
