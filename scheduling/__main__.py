"""Command line: `python -m scheduling <command>`. Each command module exposes `register(subparsers)`,
which adds its sub-parser and sets `func` (returning an exit code)."""
from __future__ import annotations

import argparse
import importlib
import sys

_COMMAND_MODULES = (
    "scheduling.cli_fgd",  # fgd-replay, bench-packing
    "scheduling.cli_predictor",  # predictor-eval, power-eval, train-predictor
    "scheduling.cli_planner",  # evaluate, bench-plan, plan
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling", description="Packing, prediction and planning.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
