"""`python -m pipeline run`: the main job on the embedded defaults, with a summary of each stage."""
from __future__ import annotations

import argparse
import sys

from tabulate import tabulate


def run(args: argparse.Namespace) -> int:
    from warehouse.ingest import ingest, summarize

    print("== ingest: every file source into the warehouse", flush=True)
    summary = summarize(ingest(None))
    print(tabulate(summary, headers="keys", intfmt=","))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the main job end to end")
    p.set_defaults(func=run)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
