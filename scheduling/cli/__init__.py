"""Command line: `python -m scheduling <command>`. Each command module exposes `register(subparsers)`, which adds
its sub-parser and sets `func` (returning an exit code)."""

from __future__ import annotations

import argparse

from scheduling.cli import (
    bench_loop,
    bench_recap,
    compare_loop,
    fgd,
    jobs,
    models,
    operate,
    planning,
    services_loop,
    slurm,
)

COMMAND_MODULES = (fgd, jobs, models, planning, operate, bench_loop, compare_loop, services_loop, bench_recap, slurm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling", description="Packing, prediction and planning.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
