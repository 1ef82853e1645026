"""Command line: `python -m warehouse.connectors {regions,fetch}`.

  python -m warehouse.connectors regions [--json]
  python -m warehouse.connectors fetch --region GB --start 2021-07-01T00:00Z --end 2021-07-02T00:00Z [--load] [--json]

`fetch` without `--load` only reports what the feeds return; `--load` writes it into the warehouse.
`--json` prints one JSON document on stdout and nothing else there (logs go to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict

from warehouse.connectors.feeds import LiveFeeds, batches_for, load_feed_config
from warehouse.connectors.ingest import LiveIngestError, ingest_live


def _regions(args: argparse.Namespace) -> int:
    config = load_feed_config(args.config)
    rows = [
        {
            "region": r.region,
            "primary": r.primary,
            "fallback": r.fallback,
            "extras": list(r.extras),
            "forecasts": list(r.forecasts),
            "codes": dict(r.codes),
        }
        for r in config.regions.values()
    ]
    if args.json:
        print(json.dumps({"regions": rows}, indent=2))
    else:
        for row in rows:
            print(
                f"{row['region']:6s} primary={row['primary']:15s} fallback={row['fallback'] or '-':15s} "
                f"extras={','.join(row['extras']) or '-'}"
            )
    return 0


def _fetch(args: argparse.Namespace) -> int:
    config = load_feed_config(args.config)
    regions = args.region or list(config.regions)
    if args.load:
        try:
            report = ingest_live(regions, args.start, args.end, config=config, forecasts=not args.no_forecasts)
            payload = {
                "start": report.start,
                "end": report.end,
                "loaded": [asdict(r) for r in report.results],
                "warnings": [asdict(f) for f in report.failures],
            }
            code = 0
        except LiveIngestError as exc:
            payload = {"loaded": [asdict(r) for r in exc.results], "failures": [asdict(f) for f in exc.failures]}
            code = 1
    else:
        feeds = LiveFeeds(config)
        summary, failures = [], []
        for region in regions:
            try:
                fetched = feeds.fetch_region(region, args.start, args.end)
            except Exception as exc:  # report every region
                failures.append(str(exc))
                continue
            summary.append(
                {
                    "region": region,
                    "served_by": fetched.served_by,
                    "fallback_used": fetched.fallback_used,
                    "errors": fetched.errors,
                    "tables": {b.table: len(b.frame) for b in batches_for(fetched.data, fetched.start, fetched.end)},
                }
            )
        payload, code = {"regions": summary, "failures": failures}, (1 if failures else 0)
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        for row in payload.get("regions", []):
            served = row["served_by"] + (" (fallback)" if row["fallback_used"] else "")
            print(f"{row['region']:6s} {served:28s} " + " ".join(f"{t}={n}" for t, n in row["tables"].items()))
        for row in payload.get("loaded", []):
            print(f"{row['table']:32s} {row['batch_id']:60s} rows={row['rows']} unchanged={row['skipped_unchanged']}")
        for failure in payload.get("failures", []) + payload.get("warnings", []):
            print(f"FAILED: {failure}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warehouse.connectors", description="Live grid feeds.")
    parser.add_argument(
        "--config", help="feed config YAML (default warehouse/connectors/feeds.yaml or LIVE_FEEDS_CONFIG)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("regions", help="list regions and their feeds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_regions)
    p = sub.add_parser("fetch", help="fetch an interval (and --load it)")
    p.add_argument("--region", action="append", help="region (repeatable; default all configured)")
    p.add_argument("--start", required=True, help="interval start, ISO 8601 (UTC if no zone)")
    p.add_argument("--end", required=True, help="interval end (exclusive)")
    p.add_argument("--load", action="store_true", help="load into the warehouse")
    p.add_argument("--no-forecasts", action="store_true", help="skip the forecast feeds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_fetch)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
