"""Inference services planned hour by hour for carbon (`scheduling.planning.serving`) against static provisioning,
on ServeGen's request rates and the grid's actual intensity.

Setting (stated, not taken from the sources):
* **Services**: ServeGen's three language models, each served by a model of the ML.ENERGY runs of about its size
  class (`SERVICES`): m-large by Llama-3.1-70B, m-mid by Qwen3-32B, m-small by Llama-3.1-8B, on H100s, with a p90
  inter-token latency target of `SLO_MS`; their home and allowed regions as listed. Demand = requests/s x the
  hour's mean output tokens per request, at ServeGen's full rate (`scale` 1).
* **Serving clusters**: the reference fleet has no H100s, so one H100 cluster of `SERVING_GPUS` GPUs is declared in
  each of the fleet's first six regions (`serving_clusters`; PUE 1.2), used by services only.
* **Calendar**: ServeGen's day 1 is 2021-07-01 (`forecasting.data.SERVEGEN_START`); days 1-7 fit the load forecast
  (seasonal naive, `forecasting.evaluation.service_load`), days 8-14 are evaluated.

Each evaluated hour the plan takes the forecast load's P90 (issued at 00:00 for the day), or `RECENT_MARGIN` x the
last observed hour's demand where that is more, and the intensity forecast for the hour, and provisions every
service; the hour is then served at its actual load with the serving model
(`at_load`): carbon at the actual intensity, a service-hour meets its target when no replica is saturated and the
latency at the load each replica carries is within it. The counterfactual, static provisioning: the home region's
cluster, the model's smallest replica, the default batch cap (`DEFAULT_BATCH`, vLLM's `max_num_seqs`; the nearest
measured cap), the GPUs' default (maximum) power limit, and replicas for the peak demand of the fitting days.
Hours whose actual rate is missing (ServeGen's collection gaps) are not scored on either side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.data import service_load_hourly
from forecasting.evaluation.service_load import SERVICE_LOAD_MODELS
from scheduling.domain.fleet import load_fleet
from scheduling.models.serving import fit_serving_model
from scheduling.planning.forecasts import GridSeries, make_forecasts
from scheduling.planning.serving import (
    Service,
    ServingCluster,
    ServingPolicy,
    plan_services,
    serve,
    static_provision,
    wanted_demand,
)

SLO_MS = 100.0
SERVING_GPUS = 256
SERVING_REGIONS = 6
US = ("us-west", "us-south", "us-east", "us-northeast")
SERVICES = (
    Service("m-large", "meta-llama/Llama-3.1-70B-Instruct", "H100", SLO_MS, "us-west", US),
    Service("m-mid", "Qwen/Qwen3-32B", "H100", SLO_MS, "eu-central", ("eu-north", "eu-central")),
    Service("m-small", "meta-llama/Llama-3.1-8B-Instruct", "H100", SLO_MS, "us-east"),
)
TRACES = {"m-large": "language/m-large", "m-mid": "language/m-mid", "m-small": "language/m-small"}


def serving_clusters(fleet=None, gpus: int = SERVING_GPUS, gpu: str = "H100", pue: float = 1.2) -> list:
    """One declared `gpu` cluster per region of the fleet's first SERVING_REGIONS regions (see the module doc)."""
    fleet = fleet if fleet is not None else load_fleet(regions=SERVING_REGIONS)
    regions = dict(zip(fleet.cluster_regions, fleet.cluster_zones))
    return [ServingCluster(f"{r}-{gpu.lower()}", r, z, gpu, gpus, pue) for r, z in regions.items()]


def evaluate_services(
    train_days: int = 7,
    data_dir=None,
    db_path=None,
    forecasts: str = "auto",
    policy: ServingPolicy | None = None,
    services=SERVICES,
    progress=None,
) -> dict:
    """The evaluation of the module doc: per service and in all, tokens, kgCO2e, gCO2e per 1k tokens and the share
    of service-hours within the target, planned and static, and the reduction; `hours`: every service-hour."""
    policy = policy or ServingPolicy()
    model = fit_serving_model(data_dir)
    clusters = serving_clusters()
    by_name = {c.name: c for c in clusters}
    home = {s.name: next(c for c in clusters if c.region == s.home_region) for s in services}
    loads = service_load_hourly(data_dir)
    demand, forecast = {}, {}
    for s in services:
        part = loads[loads["region"] == TRACES[s.name]].sort_values("hour_utc")
        start = part["hour_utc"].min()
        cut = start + pd.Timedelta(days=train_days)
        tokens = part.set_index("hour_utc")
        demand[s.name] = tokens["requests_per_s"] * tokens["mean_output_tokens"]
        naive = SERVICE_LOAD_MODELS["naive-24"]().fit(part[part["hour_utc"] < cut], "requests_per_s")
        issues = pd.date_range(cut, part["hour_utc"].max(), freq="D")
        f = pd.concat([naive.predict(T, 24, part) for T in issues]).set_index("target_time")["p90"]
        per_request = float(part.loc[part["hour_utc"] < cut, "mean_output_tokens"].mean())
        forecast[s.name] = (f * per_request).ffill().fillna(float(demand[s.name][demand[s.name].index < cut].max()))
    start = min(f.index.min() for f in forecast.values())
    hours = pd.date_range(start, max(f.index.max() for f in forecast.values()), freq="h")
    zones = list(dict.fromkeys(c.zone for c in clusters))
    grid = GridSeries.load(zones, start, hours[-1] + HOUR, data_dir=data_dir, db_path=db_path)
    provider = make_forecasts(forecasts, grid, zones, start=start, end=hours[-1] + HOUR, db_path=db_path,
                              data_dir=data_dir)  # fmt: skip
    zone_of = {c.name: zones.index(c.zone) for c in clusters}
    peaks = {s.name: float(demand[s.name][demand[s.name].index < start].max()) for s in services}
    static = {s.name: static_provision(model, s, peaks[s.name], home[s.name]) for s in services}
    rows, previous = [], {}
    for t in hours:
        F, _, _ = provider.at(t, 1)
        actual = grid.window(t, 1)[0][grid.zone_index(zones)]
        intensity = {c.name: float(F[0, zone_of[c.name]]) for c in clusters}
        # the day-ahead P90, but never below the last observed hour (known at t) with a margin: bursts outlast a day
        wanted = {
            s.name: wanted_demand(float(forecast[s.name].get(t, np.nan)), _last_known(demand[s.name], t))
            for s in services
        }
        plan = plan_services(model, list(services), wanted, clusters, intensity,
                             {c.name: c.gpus for c in clusters}, previous, policy)  # fmt: skip
        previous = plan
        for s in services:
            d = float(demand[s.name].get(t, np.nan))
            if not np.isfinite(d) or s.name not in plan:
                if s.name not in plan:
                    rows.append({"service": s.name, "hour": t, "unserved": True})
                continue
            p = plan[s.name]
            c, h = by_name[p.cluster], home[s.name]
            mine = serve(model, p, d, s.slo_ms, c.pue, float(actual[zone_of[c.name]]))
            ref = serve(model, static[s.name], d, s.slo_ms, h.pue, float(actual[zone_of[h.name]]))
            rows.append(
                {
                    "service": s.name,
                    "hour": t,
                    "unserved": False,
                    "demand_tokens_per_s": d,
                    "cluster": p.cluster,
                    "replicas": p.replicas,
                    "gpus": p.gpus,
                    "batch_cap": p.batch_cap,
                    **mine,
                    **{f"static_{k}": v for k, v in ref.items()},
                    "static_gpus": static[s.name].gpus,
                }
            )
        if progress is not None:
            progress(t)
    frame = pd.DataFrame(rows)
    return {"services": _summary(frame, services, static), "hours": frame}


def _last_known(series: pd.Series, t) -> float:
    """The series' last observed value before hour `t` (0 when none)."""
    known = series[(series.index < t) & np.isfinite(series)]
    return float(known.iloc[-1]) if len(known) else 0.0


def _summary(frame: pd.DataFrame, services, static) -> dict:
    def stats(part: pd.DataFrame) -> dict:
        scored = part[~part["unserved"].astype(bool)]
        out = {"service_hours": int(len(scored)), "unserved_hours": int(part["unserved"].astype(bool).sum())}
        for side, prefix in (("planned", ""), ("static", "static_")):
            tokens, kg = float(scored[f"{prefix}tokens"].sum()), float(scored[f"{prefix}kgco2e"].sum())
            out[side] = {
                "tokens": tokens,
                "kgco2e": kg,
                "g_per_1k_tokens": 1e6 * kg / tokens if tokens else None,
                # an hour the plan could not provision counts as missed
                "slo_attainment_pct": 100.0
                * float(scored[f"{prefix}slo_met"].astype(bool).sum())
                / max(len(scored) + (out["unserved_hours"] if side == "planned" else 0), 1),
            }
        p, s = out["planned"]["g_per_1k_tokens"], out["static"]["g_per_1k_tokens"]
        out["reduction_pct"] = 100.0 * (1.0 - p / s) if p is not None and s else None
        return out

    result = {name: stats(frame[frame["service"] == name]) for name in [s.name for s in services]}
    for s in services:
        part = frame[(frame["service"] == s.name) & ~frame["unserved"].astype(bool)]
        result[s.name]["mean_gpus"] = float(part["gpus"].mean())
        result[s.name]["static_gpus"] = static[s.name].gpus
        result[s.name]["clusters"] = part["cluster"].value_counts().to_dict()
    result["all"] = stats(frame)
    return result


def services_markdown(result: dict) -> str:
    """Per service and in all: gCO2e per 1k tokens and target attainment, planned and static; the reduction."""
    lines = [
        "| service | GPUs: planned (mean) / static | clusters used (hours) | gCO2e per 1k tokens: planned / static "
        "| reduction | p90 latency target met: planned / static |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in result["services"].items():
        p, s = r["planned"], r["static"]
        gpus = f"{r['mean_gpus']:.1f} / {r['static_gpus']}" if "mean_gpus" in r else "–"
        used = ", ".join(f"{c} ({n})" for c, n in r.get("clusters", {}).items()) or "–"
        lines.append(
            f"| {name} | {gpus} | {used} | {p['g_per_1k_tokens']:.4f} / {s['g_per_1k_tokens']:.4f} | "
            f"{r['reduction_pct']:.1f} % | {p['slo_attainment_pct']:.1f} % / {s['slo_attainment_pct']:.1f} % |"
        )
    return "\n".join(lines)


def plot_services(hours: pd.DataFrame, path) -> Path:
    """Per service, hour by hour: the GPUs planned against static provisioning (with the demand, right axis) and
    the gCO2e per 1k tokens of both (PNG)."""
    import matplotlib  # noqa: PLC0415 - plotting loads only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    served = hours[~hours["unserved"].astype(bool)].sort_values("hour")
    names = list(dict.fromkeys(served["service"]))
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 6.5), constrained_layout=True, squeeze=False)
    for col, name in enumerate(names):
        part = served[served["service"] == name]
        top, bottom = axes[0][col], axes[1][col]
        top.step(part["hour"], part["gpus"], where="post", label="planned GPUs")
        top.step(part["hour"], part["static_gpus"], where="post", label="static GPUs", linestyle="--")
        top.set_title(name)
        top.set_ylabel("GPUs")
        demand = top.twinx()
        demand.plot(part["hour"], part["demand_tokens_per_s"] / 1000.0, color="grey", alpha=0.5, linewidth=0.8)
        demand.set_ylabel("demand (k tokens/s)", color="grey")
        top.legend(loc="upper left", fontsize=8)
        bottom.plot(part["hour"], 1e6 * part["kgco2e"] / part["tokens"], label="planned")
        bottom.plot(part["hour"], 1e6 * part["static_kgco2e"] / part["static_tokens"], label="static", linestyle="--")
        bottom.set_ylabel("gCO2e per 1k tokens")
        bottom.legend(loc="upper left", fontsize=8)
        for ax in (top, bottom):
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
