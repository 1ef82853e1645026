"""An evaluation's results: every policy, the bound and the ablations on one scenario (`evaluate`, a JSON-ready
dict), each policy's share of the optimum's reduction over trace seeds (`over_seeds`), and the markdown report.

    report = evaluate(build_scenario(start="2021-07-01", days=14, n_jobs=1000, regions=6, load=0.5))
    print(report_markdown([report]))
"""

from __future__ import annotations

import math
import os
import platform
import sys

import numpy as np
import pandas as pd
import scipy
from tqdm import tqdm

from scheduling.evaluation.ablations import PERFECT_INFORMATION, REFERENCE_RUNS, run_ablations
from scheduling.evaluation.bounds import PER_JOB_KEY, BoundNotSolved, gap_by_job_shape, solve_optimum
from scheduling.evaluation.exact import EXACT_KEYS, solve_node_optimum
from scheduling.evaluation.exact_report import exact_instances, exact_markdown
from scheduling.evaluation.scenario import demand_gpu_hours
from scheduling.evaluation.scenario_record import Scenario
from scheduling.evaluation.simulator import BASELINE, simulate
from scheduling.planning.forecasts import SIGNAL
from scheduling.planning.policies.registry import ONLINE_POLICIES
from scheduling.planning.problem import PriorityWeights

OUR_POLICIES = ("priority", "rolling-lp")
REPORT_POLICIES = (
    "priority",
    "rolling-lp",
    "priority-noprices",
    "carbon-time",
    "greedy-carbon",
    "performance-first",
    "round-robin",
    "random",
)


def environment() -> dict:
    """The machine and library versions a result was measured with."""
    return {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "scipy": scipy.__version__,
        "platform": platform.platform(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def evaluate(
    sc: Scenario,
    policies=ONLINE_POLICIES,
    *,
    with_optimum: bool = True,
    seed: int = 0,
    weights: PriorityWeights | None = None,
    progress: bool = False,
    lp_time_limit_s: float = 600.0,
    ablations: bool = False,
    postpone_margin_h: float = 1.0,
    exact: bool = False,
    exact_time_limit_s: float = 600.0,
) -> dict:
    """Every policy (performance-first always), the bound and, with `ablations`, the runs of
    `ablations.ABLATION_RUNS` on one scenario, each with its reduction against performance-first and its share of
    the optimum's reduction; a JSON-ready dict. Ablations: the priority policy without capacity prices, priority
    (and rolling-lp, when run) with oracle (actual) and seasonal-naive forecasts, and rolling-lp with perfect
    information (oracle forecasts and the trace's true next arrivals): what the same hourly plan reaches on the same
    nodes when nothing is uncertain."""
    policies = list(policies)
    if BASELINE not in policies:
        policies.append(BASELINE)
    bar = None
    if progress:
        bar = tqdm(
            total=len(policies) * (sc.hours + sc.tail_hours),
            file=sys.stderr,
            unit="h",
            desc=f"{sc.start.date()} load={sc.load}",
            leave=False,
        )
    results, records = {}, {}
    for name in policies:
        if bar is not None:
            bar.set_postfix_str(name)
        res = simulate(sc, name, seed=seed, weights=weights, progress=bar, postpone_margin_h=postpone_margin_h)
        results[name] = res.metrics
        if name in OUR_POLICIES:
            records[name] = res.records
    if bar is not None:
        bar.close()
    opt, opt_error = None, None
    if with_optimum:
        try:
            opt = solve_optimum(sc, lp_time_limit_s, per_job=True)
        except BoundNotSolved as exc:  # the policies' results stand; the shares are then unknown, not made up
            opt_error = str(exc)
            print(f"[evaluate] {sc.start.date()} load {sc.load}: {opt_error}", file=sys.stderr)
    base = results[BASELINE]["kgco2e"]
    gaps = None
    if opt is not None:
        per_job = opt.pop(PER_JOB_KEY)
        gaps = {name: gap_by_job_shape(sc, rec, per_job, base) for name, rec in records.items()}
    for m in results.values():
        m["reduction_vs_performance_first_pct"] = 100.0 * (base - m["kgco2e"]) / base if base else None
        if opt is not None and base - opt["kgco2e"] > 1e-9:
            m["share_of_optimum_reduction_pct"] = 100.0 * (base - m["kgco2e"]) / (base - opt["kgco2e"])
        else:
            m["share_of_optimum_reduction_pct"] = None
    if opt is not None:
        opt["reduction_vs_performance_first_pct"] = 100.0 * (base - opt["kgco2e"]) / base if base else None
        opt["share_of_optimum_reduction_pct"] = 100.0
    extra = (
        run_ablations(sc, policies, seed=seed, weights=weights, postpone_margin_h=postpone_margin_h)
        if ablations
        else {}
    )
    node_opt = None
    if exact:  # the node-aware optimum: the best schedule real nodes allow, beside the LP bound
        found = solve_node_optimum(sc, time_limit_s=exact_time_limit_s)
        node_opt = {key: found[key] for key in EXACT_KEYS}
        node_opt["reduction_vs_performance_first_pct"] = 100.0 * (base - found["kgco2e"]) / base if base else None
        for m in [*results.values(), *extra.values(), *([opt] if opt is not None else [])]:
            m["share_of_exact_optimum_reduction_pct"] = (
                100.0 * (base - m["kgco2e"]) / (base - found["kgco2e"]) if base - found["kgco2e"] > 1e-9 else None
            )
    for m in extra.values():
        m["reduction_vs_performance_first_pct"] = 100.0 * (base - m["kgco2e"]) / base if base else None
        m["share_of_optimum_reduction_pct"] = (
            100.0 * (base - m["kgco2e"]) / (base - opt["kgco2e"])
            if opt is not None and base - opt["kgco2e"] > 1e-9
            else None
        )
    fallback = results.get("priority", next(iter(results.values())))["forecast_fallback_share"]
    report = {
        "config": {**sc.config, "postpone_margin_h": postpone_margin_h},
        "signal": SIGNAL,
        "forecasts": {
            **sc.forecasts.describe(),
            "used": sc.forecasts.name,
            "fallback_share_of_cells": fallback,
            "note": (
                "naive = seasonal naive from actuals known at the planning hour"
                if sc.forecasts.name == "naive"
                else None
            ),
        },
        "fleet": {"total_gpus": sc.fleet.total_gpus, "clusters": sc.fleet.capacity_table().to_dict("records")},
        "jobs": {
            "n": int(len(sc.jobs)),
            "gpu_hours_home": round(demand_gpu_hours(sc.jobs, sc.table, on="home"), 1),
            "by_class": {str(k): int(v) for k, v in sc.jobs["workload_class"].value_counts().items()},
            "mean_duration_h_ref": float(sc.jobs["duration_h_ref"].mean()),
            "mean_flexibility": float(sc.jobs["flexibility"].mean()),
        },
        "policies": results,
        "optimum": opt,
        **({"exact_optimum": node_opt} if node_opt is not None else {}),
        **({"optimum_error": opt_error} if opt_error else {}),
        "ablations": extra or None,
        "gap_by_job_shape": gaps,
        "targets": targets(results, opt),
        "environment": environment(),
    }
    return json_ready(report)


def targets(results: dict, opt: dict | None = None) -> dict:
    """The targets (>= 90 % of the optimum's reduction, >= 98 % deadlines) checked for each of our policies."""
    out = {}
    for name in OUR_POLICIES:
        ours = results.get(name)
        if ours is None:
            continue
        share = ours.get("share_of_optimum_reduction_pct")
        out[name] = {
            "share_of_optimum_reduction_pct": share,
            "share_target_90_met": None if share is None else bool(share >= 90.0),
            "deadline_satisfaction": ours["deadline_satisfaction"],
            "deadline_target_98_met": bool(ours["deadline_satisfaction"] >= 0.98),
        }
    return out


def json_ready(value):
    """`value` with numpy scalars as Python ones, floats rounded to 6 digits (NaN and inf: None), timestamps as ISO
    strings, tuples as lists and keys as strings."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 6)
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


METHOD_NOTES = """
How to read this:
* Jobs: openb GPU pods (CPU, memory, GPU count and share) arriving with the trace's time of day over the period,
  Philly run times conditioned on GPU count (clipped to 1-48 h, read as V100 hours; other GPUs by Gavel's measured
  speed per job type), a Gavel job-type mix (vision, language, recommendation, RL), deadline = submission +
  home-cluster run time x (1 + flexibility), flexibility per class (20-60 %). Plans every hour; no job is
  preempted (preemption is opt-in, not in these runs).
* Load: the fleet (whole openb / PAI nodes per cluster, equal weights) is sized so that the jobs' GPU-hours as
  performance-first runs them (slow GPUs included) are the target share of the fleet's GPU-hours in the period
  (`placed load`; up to two re-sizes from a GPU-count-weighted estimate, each measured, the closest kept; a job
  sharing a GPU counts its GPU-milli, or with `--load-basis device-share` the device share it holds); clusters
  that some jobs alone can run on (their GPU models) get at least the GPUs those jobs need at the load. The job
  trace is drawn on the sized fleet, so home clusters and deadlines refer to clusters that exist. `util.` is the
  measured mean GPU allocation inside the period: lower, since the fleet starts empty and late arrivals run after
  the period.
* Carbon: energy = GPU share x average board power at the chosen power limit x run time x PUE (+ network energy
  when a job leaves its home region), charged at the actual hourly intensity of the cluster's zone.
* `priority` = the specified priority order (P = 0.35 U + 0.40 F + 0.25 O, lowest P planned first), minimum
  forecast carbon over (power limit, start hour, region), plus capacity prices learned each day from the LP duals
  of the previous 72 h of arrivals; `priority-noprices` is the same without the prices.
* `rolling-lp` = model-predictive control with the optimum's own LP: every hour the LP over the jobs known then,
  the capacity left and the *forecast* (15 % capacity head-room for node packing, 6-hour capacity blocks after
  24 h, on clusters with three or more 8-GPU nodes one in three, at most one, kept on standby for 8-GPU jobs
  (and for a job due now that no other node takes) and seen by the LP as a cluster of its own, and the last 18 h
  of arrivals replayed 18 h later as expected jobs); the jobs it
  starts at hour 0, and every job whose latest timely start is now, start; the rest wait.
* `optimum` is a bound: the LP relaxation with every job and the actual intensity known in advance, fractional
  jobs and capacity aggregated per cluster (no node packing). Its deadline figure counts the share of jobs its
  solution runs late. "share of optimum" = (performance-first - policy) / (performance-first - optimum).
"""


def over_seeds(reports: list[dict], partial: bool = False) -> list[dict]:
    """Per period and load evaluated on more than one trace seed: each policy's (and the bound's) share of the
    optimum's reduction and deadline satisfaction over the seeds (mean, min, max; policies run on every seed), and
    the reference ablations (`REFERENCE_RUNS`: rolling-lp with perfect information) where they ran.
    `partial`: every period and load, and each policy over the seeds it ran on (`runs` says how many), e.g. the
    baselines run on one seed beside ours on three."""
    groups: dict[tuple, list[dict]] = {}
    for rep in reports:
        cfg = rep["config"]
        groups.setdefault((cfg["start"], cfg["load_target"], cfg["n_jobs_requested"], cfg["days"]), []).append(rep)
    rows = []
    for (start, load, _, _), reps in groups.items():
        seeds = sorted({int(r["config"]["seed"]) for r in reps})
        if not partial and (len(seeds) < 2 or len(seeds) != len(reps)):
            continue
        runs = [
            {**r["policies"], **{k: m for k, m in (r.get("ablations") or {}).items() if k in REFERENCE_RUNS}}
            for r in reps
        ]
        names = list(dict.fromkeys(p for x in runs for p in x if partial or all(p in y for y in runs)))
        for name in names + (["optimum"] if all(r.get("optimum") for r in reps) else []):
            pairs = [
                (r, r["optimum"] if name == "optimum" else x[name])
                for r, x in zip(reps, runs)
                if name == "optimum" or name in x
            ]
            ran, ms = [r for r, _ in pairs], [m for _, m in pairs]
            share = [m.get("share_of_optimum_reduction_pct") for m in ms]
            dl = [m["deadline_satisfaction"] for m in ms]
            kg = [m["kgco2e"] for m in ms]
            ok = all(v is not None for v in share)
            rows.append(
                {
                    "start": start,
                    "load_target": load,
                    "seeds": sorted(int(r["config"]["seed"]) for r in ran),
                    "policy": name,
                    "runs": len(ran),
                    "share_mean_pct": float(np.mean(share)) if ok else None,
                    "share_min_pct": float(np.min(share)) if ok else None,
                    "share_max_pct": float(np.max(share)) if ok else None,
                    "deadlines_mean": float(np.mean(dl)),
                    "deadlines_min": float(np.min(dl)),
                    "deadlines_max": float(np.max(dl)),
                    "kgco2e_mean": float(np.mean(kg)),
                }
            )
    return rows


def _row_label(name: str) -> str:
    return {"optimum": "optimum (bound)", PERFECT_INFORMATION: f"*{PERFECT_INFORMATION}* (reference)"}.get(name, name)


def report_markdown(reports: list[dict]) -> str:
    """The README table(s): periods x loads x policies, the bound beside them, plus the fleet per region."""
    lines = ["# Carbon-aware planner: simulated results", ""]
    if not reports:
        return "\n".join(lines + ["(no results)"])
    r0 = reports[0]
    seeds = ", ".join(str(v) for v in dict.fromkeys(r["config"]["seed"] for r in reports))
    lines += [
        f"Signal: {r0['signal']}. Each row replays {r0['config']['n_jobs']} jobs (openb pods, Philly durations, "
        f"Gavel job-type mix; trace seed {seeds}) over {r0['config']['days']} days on "
        f"{len(r0['config']['regions'])} regions, planning every hour from the forecast known then and charging "
        "the actual intensity. `optimum` is the LP relaxation with perfect knowledge (a bound, not a schedule).",
        "",
        "Columns: kgCO2e; reduction vs performance-first; share of the optimum's reduction captured; deadline "
        "satisfaction; mean delay (h); unallocated GPUs (mean over the period); energy (kWh); renewable share of "
        "the energy used; utilisation.",
        "",
    ]
    lines += METHOD_NOTES.strip().splitlines() + [""]
    summary = over_seeds(reports)
    if summary:
        lines += [
            "## Over trace seeds",
            "",
            "Each period and load on several trace seeds (the jobs, their arrival times and home clusters change "
            "with the seed, and so the fleet's size and nodes): mean and range over the seeds; single runs "
            "follow below.",
            "",
            "| period | load | seeds | policy | share of optimum: mean (min-max) | deadlines: mean (min) | "
            "kgCO2e mean |",
            "|---|---:|---|---|---:|---:|---:|",
        ]
        for r in summary:
            share = (
                f"{fmt(r['share_mean_pct'])} % ({fmt(r['share_min_pct'])}-{fmt(r['share_max_pct'])})"
                if r["share_mean_pct"] is not None
                else "n/a"
            )
            lines.append(
                f"| {r['start'][:10]} | {r['load_target']} | {', '.join(map(str, r['seeds']))} | "
                f"{_row_label(r['policy'])} | {share} | "
                f"{fmt(100 * r['deadlines_mean'])} % ({fmt(100 * r['deadlines_min'])} %) | "
                f"{fmt(r['kgco2e_mean'], 1)} |"
            )
        lines.append("")
    lines += exact_markdown(exact_instances(reports))
    several = len({rep["config"]["seed"] for rep in reports}) > 1
    for rep in reports:
        cfg = rep["config"]
        fc = rep["forecasts"]
        base = rep["policies"].get("performance-first", {})
        per_region = ", ".join(str(c["gpus"]) for c in rep["fleet"]["clusters"])
        used = fc.get("used")
        if used == "warehouse":
            versions = ", ".join(fc.get("model_versions") or []) or "unversioned"
            used = f"forecast.forecasts {fc.get('model')} ({versions})"
        seed = f", trace seed {cfg['seed']}" if several else ""
        basis = cfg.get("load_basis", "gpu-milli")
        placed = "placed load"
        if basis != "gpu-milli":
            kept = [c["placed_load"] for c in cfg.get("load_calibration", []) if c.get("used")]
            seed += f" on the {basis} basis" + (f" (performance-first places {fmt(kept[0], 2)})" if kept else "")
            placed = "GPU-milli placed load"
        lines.append(
            f"## {cfg['start'][:10]} + {cfg['days']} d, load target {cfg['load_target']}{seed} ({placed} "
            f"under performance-first {fmt(base.get('placed_load'), 2)}, {rep['fleet']['total_gpus']} GPUs: "
            f"{per_region} per region), forecasts: {used} (naive fallback share of forecast cells "
            f"{fmt(fc.get('fallback_share_of_cells'), 2)})"
        )
        lines.append("")
        lines.append(
            "| policy | kgCO2e | red. vs perf-first | share of optimum | deadlines | mean delay h | "
            "unalloc. GPUs | energy kWh | renewable | util. |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = [(p, rep["policies"][p]) for p in REPORT_POLICIES if p in rep["policies"]]
        if rep.get("optimum"):
            rows.append(("optimum (bound)", rep["optimum"]))
        for name, m in rows:
            lines.append(
                f"| {name} | {fmt(m['kgco2e'], 1)} | {fmt(m.get('reduction_vs_performance_first_pct'), 1)} % | "
                f"{fmt(m.get('share_of_optimum_reduction_pct'), 1)} % | "
                f"{fmt(100 * m['deadline_satisfaction'], 1)} % | {fmt(m.get('mean_delay_h'), 2)} | "
                f"{fmt(m.get('unallocated_gpus'), 1)} | {fmt(m['energy_kwh'], 0)} | "
                f"{fmt(100 * m['renewable_share'], 1)} % | {fmt(100 * m.get('utilization', float('nan')), 1)} % |"
            )
        lines.append("")
        if rep.get("optimum_error"):
            lines += [f"No bound for this run, so no shares: {rep['optimum_error']}", ""]
        for name, m in (rep.get("ablations") or {}).items():
            lines.insert(
                len(lines) - 1,
                f"| *{name}* | {fmt(m['kgco2e'], 1)} | "
                f"{fmt(m.get('reduction_vs_performance_first_pct'), 1)} % | "
                f"{fmt(m.get('share_of_optimum_reduction_pct'), 1)} % | "
                f"{fmt(100 * m['deadline_satisfaction'], 1)} % | {fmt(m.get('mean_delay_h'), 2)} | "
                f"{fmt(m.get('unallocated_gpus'), 1)} | {fmt(m['energy_kwh'], 0)} | "
                f"{fmt(100 * m['renewable_share'], 1)} % | "
                f"{fmt(100 * m.get('utilization', float('nan')), 1)} % |",
            )
        others = {p: m for p, m in rep["policies"].items() if p not in OUR_POLICIES}
        for name in OUR_POLICIES:
            ours = rep["policies"].get(name)
            if ours is None:
                continue
            carbon = [p for p, m in others.items() if m["kgco2e"] < ours["kgco2e"]]
            dl = [
                f"{p} ({fmt(100 * m['deadline_satisfaction'], 1)} %)"
                for p, m in others.items()
                if m["deadline_satisfaction"] > ours["deadline_satisfaction"] + 1e-9
            ]
            lines.append(
                f"Where a baseline wins against {name}: "
                + (f"less carbon: {', '.join(carbon)}; " if carbon else "no baseline emits less carbon; ")
                + (f"more deadlines met: {', '.join(dl)}." if dl else "none meets more deadlines.")
            )
            lines.append("")
        for name, by_shape in (rep.get("gap_by_job_shape") or {}).items():
            lines.append(
                f"Where {name}'s carbon above the bound comes from, by job GPU shape (GPUs per job; "
                '"if at bound": the share of the optimum\'s reduction it would capture if that shape alone '
                "ran at the bound's carbon):"
            )
            lines.append("")
            lines.append("| GPUs | jobs | kgCO2e | bound kgCO2e | gap kg | share of gap | late | if at bound |")
            lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
            for shape, g in by_shape.items():
                lines.append(
                    f"| {shape} | {g['jobs']} | {fmt(g['kgco2e'], 1)} | {fmt(g['optimum_kgco2e'], 1)} | "
                    f"{fmt(g['gap_kg'], 1)} | {fmt(g['gap_share_pct'], 1)} % | "
                    f"{fmt(100 * g['late_share'], 1)} % | {fmt(g['share_if_at_optimum_pct'], 1)} % |"
                )
            lines.append("")
        lines += _by_cluster_table(rep)
    lines.append("## Fleet capacity per region")
    lines.append("")
    for rep in reports:
        cfg = rep["config"]
        lines.append(
            f"- {cfg['start'][:10]}, load target {cfg['load_target']}"
            + (f", trace seed {cfg['seed']}" if several else "")
            + ": "
            + "; ".join(
                f"{c['region']} ({c['zone']}) {c['cluster']}: {c['nodes']} nodes, {c['gpus']} "
                f"{c['gpu_model']} GPUs, PUE {c['pue']}"
                for c in rep["fleet"]["clusters"]
            )
        )
        lines.append("")
    env = reports[0]["environment"]
    lines.append(
        f"Environment: {env['cpu_count']} CPUs, Python {env['python']}, numpy {env['numpy']}, scipy {env['scipy']}."
    )
    return "\n".join(lines) + "\n"


def fmt(v, nd: int = 1) -> str:
    """`v` with `nd` decimals; "n/a" for None, NaN and inf."""
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "n/a"
    return f"{v:.{nd}f}"


def _by_cluster_table(rep: dict) -> list[str]:
    """Per cluster (cleanest zone first): the bound's utilisation beside each of our policies', and where our
    policies' free GPUs were (whole devices, device fragments, standby nodes)."""
    opt = (rep.get("optimum") or {}).get("by_cluster")
    ours = [
        (name, rep["policies"][name]["by_cluster"])
        for name in OUR_POLICIES
        if (rep["policies"].get(name) or {}).get("by_cluster")
    ]
    if not ours:
        return []
    names = sorted(ours[0][1], key=lambda c: ours[0][1][c]["mean_intensity_g_per_kwh"])
    head = "| cluster | mean gCO2e/kWh | GPUs | bound util. |"
    rule = "|---|---:|---:|---:|"
    for name, _ in ours:
        head += f" {name} util. | free: whole / fragments / standby GPUs |"
        rule += "---:|---:|"
    lines = [
        "Where the GPUs went, per cluster (means over the period; the bound's utilisation from its fractional "
        'plan; "fragments": free shares of partly used devices, which only small jobs can use -- the bound '
        "and the planner's LP count them as usable by any job):",
        "",
        head,
        rule,
    ]
    for c in names:
        row = ours[0][1][c]
        line = (
            f"| {c} | {fmt(row['mean_intensity_g_per_kwh'], 0)} | {fmt(row['gpus'], 0)} | "
            f"{fmt(100 * opt[c]['utilization'], 1) + ' %' if opt and c in opt else 'n/a'} |"
        )
        for _, by in ours:
            m = by[c]
            line += (
                f" {fmt(100 * m['utilization'], 1)} % | {fmt(m.get('idle_gpus'), 1)} / "
                f"{fmt(m.get('fragmented_gpus'), 1)} / {fmt(m.get('standby_idle_gpus'), 1)} |"
            )
        lines.append(line)
    return lines + [""]
