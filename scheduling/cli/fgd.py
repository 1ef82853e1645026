"""Commands `fgd-replay`, `fgd-report` and `bench-packing` (see scheduling/evaluation/fgd_replay.py).

    python -m scheduling fgd-replay --trace openb_pod_list_default --policy fgd --seeds 42-51 --tune 1.3 --json
    python -m scheduling fgd-replay --policy all --seeds 42-51 --fixture-order --json   # reference orders
    python -m scheduling fgd-replay --trace family:all --policy all --seeds 42-44 --json  # family bar chart
    python -m scheduling fgd-report                  # var/reports/fgd/results.md (runs what is missing)
    python -m scheduling bench-packing --json

`fgd-replay` prints only JSON on stdout with --json (progress bars go to stderr) and writes its JSON report and
plots under --out (default var/reports/fgd/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from scheduling.evaluation import fgd_replay as fr
from scheduling.evaluation.fgd_replay import DEFAULT_OUT
from scheduling.packing.registry import POLICY_NAMES


def _default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fgd-replay",
        help="replay the FGD openb experiments on the packer",
        description="Replay openb pod lists with the packing policies; report unallocated "
        "GPU and fragmentation at arrived workload points.",
    )
    p.add_argument(
        "--trace",
        default="openb_pod_list_default",
        help="pod-list variant (openb_pod_list_<x>, or just <x>), or family:all / family:<cpu|gpushare|"
        "gpuspec|multigpu>[,...] for the per-family bar chart at arrived 100%%",
    )
    p.add_argument("--policy", default="fgd", help=f"{', '.join(POLICY_NAMES)}, a comma list, or all")
    p.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43 (default 42-51)")
    p.add_argument("--tune", type=float, default=1.3, help="tune the workload to this x GPU capacity (1.3)")
    p.add_argument(
        "--fixture-order",
        action="store_true",
        help="use the reference's arrival and node tie-break orders (default trace, seeds 42-51)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (only JSON on stdout)")
    p.add_argument("--out", default=None, help="folder for the JSON report and plots (default var/reports/fgd)")
    p.add_argument("--jobs", type=int, default=_default_jobs(), help="parallel runs (processes)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--data-dir", default=None, help="DATA_DIR override (holds openb/)")
    p.set_defaults(func=cmd_replay)

    r = subparsers.add_parser(
        "fgd-report",
        help="write var/reports/fgd/results.md (reproduction + families)",
        description="Assemble results.md from the JSON reports under --out, running the "
        "default-trace fixture reproduction (all policies, seeds 42-51), the "
        "family runs and the benchmark where their JSON is missing.",
    )
    r.add_argument("--out", default=None)
    r.add_argument("--family-seeds", default="42-51", help="seeds of the family runs (default 42-51)")
    r.add_argument("--jobs", type=int, default=_default_jobs())
    r.add_argument("--rerun", action="store_true", help="run everything again, ignoring saved JSON")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--data-dir", default=None)
    r.set_defaults(func=cmd_report)

    b = subparsers.add_parser(
        "bench-packing",
        help="benchmark one full default FGD replay (JSON)",
        description="Time one full default-trace replay (fixture order) and the per-decision "
        "latency; prints JSON with CPU count and versions.",
    )
    b.add_argument("--policy", default="fgd")
    b.add_argument("--seed", type=int, default=42)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--json", action="store_true", help="(output is always JSON)")
    b.add_argument("--out", default=None, help="also write bench_packing.json there (default var/reports/fgd)")
    b.add_argument("--data-dir", default=None)
    b.set_defaults(func=cmd_bench)


def _out_dir(arg: str | None) -> Path:
    return Path(arg) if arg else DEFAULT_OUT


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def _print_table(report: dict) -> None:
    pol = report["policies"]
    pts = [str(x) for x in report["points"]]
    print(f"trace {report['trace']} ({report['order']} order), seeds {report['seeds']}, tune {report['tune']}")
    print("unallocated GPU % (mean over seeds) at arrived workload %:")
    print(f"{'policy':<14}" + "".join(f"{x:>8}" for x in pts) + f"{'failed':>9}{'wall s':>8}")
    for e in pol.values():
        vals = e["unallocated_pct"]["mean"]
        failed = sum(e["failed_pods"].values()) / len(e["failed_pods"])
        print(f"{e['name']:<14}" + "".join(f"{vals[x]:>8.2f}" for x in pts) + f"{failed:>9.1f}{e['wall_s_mean']:>8.2f}")
    for p, c in report.get("published_comparison", {}).items():
        print(
            f"  {p}: max |ours - published| = {c['max_abs_diff']:.3f} pp (tolerance {c['tolerance']}): "
            f"{'ok' if c['within_tolerance'] else 'OUTSIDE'}"
        )


def cmd_replay(args) -> int:
    try:
        seeds = fr.parse_seeds(args.seeds)
        policies = fr.parse_policies(args.policy)
    except ValueError as exc:
        print(f"fgd-replay: {exc}", file=sys.stderr)
        return 2
    out = _out_dir(args.out)
    if args.trace.startswith("family:"):
        wanted = args.trace.split(":", 1)[1]
        fams = list(fr.FAMILIES) if wanted in ("all", "") else [f.strip() for f in wanted.split(",")]
        unknown = [f for f in fams if f not in fr.FAMILIES]
        if unknown:
            print(f"fgd-replay: unknown family {unknown}; choose from {', '.join(fr.FAMILIES)} or all", file=sys.stderr)
            return 2
        report = fr.families_experiment(
            policies,
            seeds,
            args.tune,
            jobs=args.jobs,
            families=fams,
            data_dir=args.data_dir,
            show_progress=not args.no_progress,
        )
        _write_json(out / "families.json", report)
        if not args.no_plots:
            report["plot"] = str(fr.plot_families(report, out / "families_unallocated_at_100.png"))
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for fam, variants in report["families"].items():
                print(f"{fam}: unallocated GPU % at arrived 100 %")
                for v, row in variants.items():
                    print(f"  {v:<12}" + "".join(f"{fr.DISPLAY_NAMES[p]}={row[p]['mean']:.2f}  " for p in policies))
        return 0
    if args.fixture_order and fr.trace_name(args.trace) != fr.DEFAULT_TRACE:
        print("fgd-replay: --fixture-order exists for the default trace only", file=sys.stderr)
        return 2
    if args.fixture_order and any(s not in fr.FIXTURE_SEEDS for s in seeds):
        print(f"fgd-replay: fixtures cover seeds {fr.FIXTURE_SEEDS[0]}-{fr.FIXTURE_SEEDS[-1]}", file=sys.stderr)
        return 2
    try:
        report, results = fr.experiment(
            args.trace,
            policies,
            seeds,
            args.tune,
            args.fixture_order,
            jobs=args.jobs,
            data_dir=args.data_dir,
            show_progress=not args.no_progress,
        )
    except FileNotFoundError as exc:
        print(f"fgd-replay: {exc}", file=sys.stderr)
        return 2
    tag = f"{report['trace']}_{report['order']}"
    _write_json(out / f"replay_{tag}.json", report)
    if not args.no_plots:
        report["plot"] = str(
            fr.plot_unallocated(
                results,
                out / f"unallocated_{tag}.png",
                title=f"{report['trace']} ({report['order']} order), seeds {seeds[0]}-{seeds[-1]}",
            )
        )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


def cmd_bench(args) -> int:
    result = fr.bench_packing(args.policy, args.seed, args.repeats, data_dir=args.data_dir)
    _write_json(_out_dir(args.out) / "bench_packing.json", result)
    print(json.dumps(result, indent=2))
    return 0


def cmd_report(args) -> int:
    out = _out_dir(args.out)
    show = not args.no_progress
    reports = {}
    for order, fixture_order, title in (
        ("fixture", True, "default (fixture order), seeds 42-51"),
        ("shuffle", False, "default (own seeded shuffle), seeds 42-51"),
    ):
        path = out / f"replay_default_{order}.json"
        if args.rerun or not path.exists():
            report, results = fr.experiment(
                fr.DEFAULT_TRACE,
                list(fr.POLICY_NAMES),
                list(fr.FIXTURE_SEEDS),
                1.3,
                fixture_order,
                jobs=args.jobs,
                data_dir=args.data_dir,
                show_progress=show,
            )
            _write_json(path, report)
            fr.plot_unallocated(results, out / f"unallocated_default_{order}.png", title=title)
        reports[order] = json.loads(path.read_text())
    default_report, shuffle_report = reports["fixture"], reports["shuffle"]
    fam_path = out / "families.json"
    if args.rerun or not fam_path.exists():
        fam = fr.families_experiment(
            list(fr.POLICY_NAMES),
            fr.parse_seeds(args.family_seeds),
            1.3,
            jobs=args.jobs,
            data_dir=args.data_dir,
            show_progress=show,
        )
        _write_json(fam_path, fam)
        fr.plot_families(fam, out / "families_unallocated_at_100.png")
    fam_report = json.loads(fam_path.read_text())
    bench_path = out / "bench_packing.json"
    if args.rerun or not bench_path.exists():
        _write_json(bench_path, fr.bench_packing("fgd", 42, 1, data_dir=args.data_dir))
    bench = json.loads(bench_path.read_text())
    commands = [
        "python -m scheduling fgd-report   # runs what is missing of:",
        "python -m scheduling fgd-replay --trace openb_pod_list_default --policy all --seeds 42-51 "
        "--tune 1.3 --fixture-order --json",
        "python -m scheduling fgd-replay --trace openb_pod_list_default --policy all --seeds 42-51 --tune 1.3 --json",
        f"python -m scheduling fgd-replay --trace family:all --policy all --seeds {args.family_seeds} "
        "--tune 1.3 --json",
        "python -m scheduling bench-packing --json",
    ]
    md = fr.results_markdown(default_report, fam_report, bench, commands, shuffle_report)
    path = out / "results.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(md)
    print(str(path))
    return 0


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    parser = argparse.ArgumentParser(prog="scheduling.cli.fgd")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
