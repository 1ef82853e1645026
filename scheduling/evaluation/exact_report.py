"""Shares of the node-aware optimum's reduction over a set of small instances: JSON rows and the markdown section.

Input: `evaluate(..., exact=True)` reports. Per instance, every policy and ablation gets its carbon, its share of
the node-aware optimum's reduction (against performance-first), its share of the LP bound's reduction and its
deadline satisfaction; the summary averages them over the instances and checks the targets (rolling-lp >= 90 % of
the node-aware optimum's reduction on average, no instance below 80 %, >= 98 % of deadlines met in every instance).
"""

from __future__ import annotations

import numpy as np

from scheduling.evaluation.ablations import PERFECT_INFORMATION

TARGET_POLICY = "rolling-lp"
TARGET_MEAN_SHARE_PCT, TARGET_MIN_SHARE_PCT, TARGET_DEADLINES = 90.0, 80.0, 0.98
_SHOWN = ("rolling-lp", PERFECT_INFORMATION, "rolling-lp-naive-forecast", "priority", "carbon-time")


def exact_instances(reports: list[dict]) -> list[dict]:
    """One entry per report that has a node-aware optimum: the instance, both optima and every run's shares."""
    out = []
    for rep in reports:
        node = rep.get("exact_optimum")
        if not node:
            continue
        cfg, lp = rep["config"], rep.get("optimum") or {}
        runs = {**rep["policies"], **(rep.get("ablations") or {})}
        out.append(
            {
                "instance": f"{cfg['start'][:10]} load {cfg['load_target']} seed {cfg['seed']}",
                "start": cfg["start"],
                "load_target": cfg["load_target"],
                "seed": cfg["seed"],
                "n_jobs": cfg["n_jobs"],
                "days": cfg["days"],
                "gpus": rep["fleet"]["total_gpus"],
                "nodes": int(sum(c["nodes"] for c in rep["fleet"]["clusters"])),
                "forecasts": rep["forecasts"].get("used"),
                "performance_first_kgco2e": rep["policies"]["performance-first"]["kgco2e"],
                "exact_optimum": node,
                "lp_bound_kgco2e": lp.get("kgco2e"),
                "lp_bound_deadline_satisfaction": lp.get("deadline_satisfaction"),
                # how far the LP bound lies below the best schedule of whole jobs on these nodes
                "lp_bound_below_exact_pct": (
                    100.0 * (node["kgco2e"] - lp["kgco2e"]) / node["kgco2e"] if lp.get("kgco2e") else None
                ),
                "lp_bound_share_of_exact_reduction_pct": lp.get("share_of_exact_optimum_reduction_pct"),
                "policies": {
                    name: {
                        "ablation": name not in rep["policies"],
                        "kgco2e": m["kgco2e"],
                        "share_of_exact_optimum_reduction_pct": m.get("share_of_exact_optimum_reduction_pct"),
                        "share_of_lp_bound_reduction_pct": m.get("share_of_optimum_reduction_pct"),
                        "deadline_satisfaction": m["deadline_satisfaction"],
                    }
                    for name, m in runs.items()
                },
            }
        )
    return out


def _stats(values: list[float]) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}


def exact_summary(instances: list[dict]) -> dict:
    """Per policy over the instances: share of the node-aware optimum's reduction and of the LP bound's, deadline
    satisfaction (mean, min, max); the LP bound's distance below the node-aware optimum; the targets checked."""
    names = list(dict.fromkeys(p for inst in instances for p in inst["policies"]))
    per_policy = {}
    for name in names:
        ran = [inst["policies"][name] for inst in instances if name in inst["policies"]]
        per_policy[name] = {
            "instances": len(ran),
            "share_of_exact_optimum_reduction_pct": _stats([m["share_of_exact_optimum_reduction_pct"] for m in ran]),
            "share_of_lp_bound_reduction_pct": _stats([m["share_of_lp_bound_reduction_pct"] for m in ran]),
            "deadline_satisfaction": _stats([m["deadline_satisfaction"] for m in ran]),
        }
    ours = per_policy.get(TARGET_POLICY)
    targets = None
    if ours:
        share, dl = ours["share_of_exact_optimum_reduction_pct"], ours["deadline_satisfaction"]
        targets = {
            "policy": TARGET_POLICY,
            "mean_share_ge_90_pct": share["mean"] is not None and share["mean"] >= TARGET_MEAN_SHARE_PCT,
            "every_instance_share_ge_80_pct": share["min"] is not None and share["min"] >= TARGET_MIN_SHARE_PCT,
            "every_instance_deadlines_ge_98_pct": dl["min"] is not None and dl["min"] >= TARGET_DEADLINES - 1e-9,
        }
    nodes = [inst["exact_optimum"] for inst in instances]
    return {
        "instances": len(instances),
        "exact_optimum": {
            "proven_optimal_or_within_gap": sum(n["status"] == "optimal" for n in nodes),
            "mip_gap_max": max((n["mip_gap"] or 0.0 for n in nodes), default=None),
            "solve_s": _stats([n["solve_s"] for n in nodes]),
        },
        "lp_bound_below_exact_pct": _stats([inst["lp_bound_below_exact_pct"] for inst in instances]),
        "policies": per_policy,
        "targets": targets,
    }


def _pct(v, nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f} %"


def exact_markdown(instances: list[dict]) -> list[str]:
    """The section of the results page: the summary over the instances, then one row per instance."""
    if not instances:
        return []
    summary = exact_summary(instances)
    i0 = instances[0]
    lines = [
        "## Against the node-aware optimum (small instances)",
        "",
        f"{len(instances)} instances of {i0['n_jobs']} jobs over {i0['days']} days. The node-aware optimum "
        "(`scheduling/evaluation/exact.py`) places whole jobs on real nodes with perfect knowledge (a MILP solved "
        "to the MIP gap shown); share = (performance-first - run) / (performance-first - optimum), against the "
        "node-aware optimum and against the LP bound.",
        "",
        "| run | share of the node-aware optimum: mean (min-max) | share of the LP bound: mean (min-max) | "
        "deadlines: mean (min) |",
        "|---|---:|---:|---:|",
    ]
    for name, p in summary["policies"].items():
        ex, lp, dl = (
            p["share_of_exact_optimum_reduction_pct"],
            p["share_of_lp_bound_reduction_pct"],
            p["deadline_satisfaction"],
        )
        if ex["mean"] is None:
            continue
        lines.append(
            f"| {name} | {_pct(ex['mean'])} ({ex['min']:.1f}-{ex['max']:.1f}) | "
            + (f"{_pct(lp['mean'])} ({lp['min']:.1f}-{lp['max']:.1f})" if lp["mean"] is not None else "n/a")
            + f" | {_pct(100 * dl['mean'])} ({_pct(100 * dl['min'])}) |"
        )
    gap, node = summary["lp_bound_below_exact_pct"], summary["exact_optimum"]
    lines += [
        "",
        f"The LP bound lies {gap['mean']:.1f} % below the node-aware optimum on average ({gap['min']:.1f}-"
        f"{gap['max']:.1f} %). Node-aware optimum: {node['proven_optimal_or_within_gap']} of "
        f"{summary['instances']} solved within the MIP gap tolerance (largest gap {100 * node['mip_gap_max']:.2f} "
        f"%), {node['solve_s']['mean']:.0f} s per solve on average (max {node['solve_s']['max']:.0f} s).",
        "",
    ]
    if summary["targets"]:
        t = summary["targets"]
        lines += [
            f"Targets for {t['policy']}: mean share >= 90 %: {'met' if t['mean_share_ge_90_pct'] else 'missed'}; "
            f"every instance >= 80 %: {'met' if t['every_instance_share_ge_80_pct'] else 'missed'}; deadlines >= 98 "
            f"% in every instance: {'met' if t['every_instance_deadlines_ge_98_pct'] else 'missed'}.",
            "",
        ]
    shown = [p for p in _SHOWN if p in summary["policies"]]
    lines += [
        "| instance | GPUs / nodes | perf.-first kg | LP bound kg | node-aware kg (gap) | LP below node-aware | "
        + " | ".join(f"{p}: share / deadlines" for p in shown)
        + " |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(shown),
    ]
    for inst in instances:
        node = inst["exact_optimum"]
        cells = []
        for p in shown:
            m = inst["policies"].get(p)
            cells.append(
                "-"
                if m is None
                else f"{_pct(m['share_of_exact_optimum_reduction_pct'])} / {_pct(100 * m['deadline_satisfaction'])}"
            )
        lines.append(
            f"| {inst['instance']} | {inst['gpus']} / {inst['nodes']} | {inst['performance_first_kgco2e']:.2f} | "
            + (f"{inst['lp_bound_kgco2e']:.2f}" if inst["lp_bound_kgco2e"] is not None else "n/a")
            + f" | {node['kgco2e']:.2f} ({100 * (node['mip_gap'] or 0):.2f} %) | "
            f"{_pct(inst['lp_bound_below_exact_pct'])} | " + " | ".join(cells) + " |"
        )
    return lines + [""]
