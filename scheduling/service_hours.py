"""Inference services in the operating loop: each hour T, before the batch jobs are planned, every service in the
queue gets its replicas for [T, T+1h) (`scheduling.planning.serving.plan_services`), and the GPUs they hold are
capacity the batch plan cannot use (one pool: `service_rows`, bound to nodes like running jobs).

* **Services**: `queue.services` submitted by T.
* **Demand**: the service's own history before T (`scheduling.queue.service_rates`), forecast by the seasonal naive
  of the load forecasts (`forecasting.evaluation.service_load`); the hour is provisioned for its P90, or 1.25 x the
  last observed hour where that is more (`wanted_demand`). Where the free GPUs cannot serve that P90 (a level shift
  in the history widens it), for 1.25 x the last hour alone.
* **Clusters**: those whose executor serves (`Executor.serves`) with a GPU model the serving data knows; the
  GPUs free for services are the devices no running batch job holds (a running job is never displaced). With
  `ServingPolicy.yield_to_batch`, a service first looks at those less the GPUs the last batch plan starts jobs on
  this hour (`batch_starts`), and only where that leaves it no option at all the free GPUs.
* **Carbon**: the fleet's intensity forecast for hour T in the cluster's zone, times the replicas' draw and PUE.
* **Written**: `plan.service_provisions` (one row per service: where, how, why), and the changes against the last
  hour as `plan.service_scalings` (`scheduling.executors.service_log`), carried out exactly once at dispatch.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from common.timeutil import HOUR, utc
from forecasting.evaluation.service_load import service_load_naive
from scheduling.executors.service_log import record_scalings
from scheduling.models.serving import at_load, curve_id, key_of, serving_model
from scheduling.planning.serving import (
    Provision,
    Service,
    ServingCluster,
    ServingPolicy,
    plan_services,
    serve,
    static_provision,
    wanted_demand,
)
from scheduling.queue.service_intake import list_services
from scheduling.queue.service_rates import rate_history
from scheduling.service import plan_forecasts
from warehouse.db import create_tables, reader, table_exists, writer

PROVISIONS = "plan.service_provisions"
PROVISION_COLUMNS: dict[str, str] = {
    "plan_id": "VARCHAR NOT NULL",
    "plan_time": "TIMESTAMPTZ NOT NULL",
    "service": "VARCHAR NOT NULL",  # tenant/service_id
    "tenant": "VARCHAR",
    "service_id": "VARCHAR",
    "cluster": "VARCHAR",  # NULL: no cluster could serve it within its target
    "region": "VARCHAR",
    "zone": "VARCHAR",
    "curve": "VARCHAR",
    "model": "VARCHAR",
    "gpu": "VARCHAR",
    "num_gpus": "INTEGER",
    "tensor_parallel": "INTEGER",
    "batch_cap": "INTEGER",
    "replicas": "INTEGER",
    "gpus": "INTEGER",
    "nodes": "VARCHAR",
    "forecast_p90_tokens_per_s": "DOUBLE",
    "last_tokens_per_s": "DOUBLE",
    "planned_tokens_per_s": "DOUBLE",  # what the hour is provisioned for (`wanted_demand`)
    "predicted_latency_ms": "DOUBLE",  # at the planned demand per replica
    "latency_slo_ms": "DOUBLE",
    "forecast_gco2_per_kwh": "DOUBLE",
    "expected_kgco2e": "DOUBLE",
    "home_expected_kgco2e": "DOUBLE",  # the same demand served in the home region's cheapest way (NULL: none)
    "previous_cluster": "VARCHAR",
    "previous_replicas": "INTEGER",
    "explanation": "VARCHAR",
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS plan;
CREATE TABLE IF NOT EXISTS {PROVISIONS} (
    {", ".join(f"{name} {kind}" for name, kind in PROVISION_COLUMNS.items())},
    PRIMARY KEY (plan_id, service)
);
"""
log = logging.getLogger(__name__)
HISTORY_DAYS = 7  # the history the load forecast is fitted on (the seasonal naive needs five days)
PEAK_DAYS = 7  # the static counterfactual is provisioned for the peak of this many days before the hour


def active_services(plan_time, db_path=None) -> pd.DataFrame:
    """The services of `queue.services` submitted by `plan_time`, with their planner id `service`."""
    frame = list_services(db_path)
    if frame.empty:
        return frame.assign(service=pd.Series(dtype=object))
    frame = frame[pd.to_datetime(frame["submitted_at"], utc=True) <= utc(plan_time)].reset_index(drop=True)
    frame["service"] = frame["tenant"] + "/" + frame["service_id"]
    if "rate_scale" not in frame.columns:
        frame["rate_scale"] = 1.0
    return frame


def as_service(row) -> Service:
    """The planner's view of a `queue.services` row."""
    gpus = tuple(row["gpu_models"]) if row["gpu_models"] is not None else ()
    return Service(
        name=row["service"],
        model=row["model"],
        gpu=gpus[0] if gpus else "",
        slo_ms=float(row["latency_slo_ms"]),
        home_region=row["home_region"],
        allowed_regions=tuple(row["allowed_regions"]) if row["allowed_regions"] is not None else (),
        min_replicas=int(row["min_replicas"]),
        task=row["task"],
        gpu_models=gpus,
    )


def serving_cluster(c) -> ServingCluster:
    """The planner's view of a fleet cluster."""
    return ServingCluster(c.name, c.config.region, c.config.zone, c.config.gpu_model, c.n_gpus, c.config.pue)


def serving_clusters(fleet, executors) -> list[ServingCluster]:
    """The fleet's clusters services may use: their executor serves and the serving data knows their GPU model."""
    known = {k.gpu for k in serving_model().keys()}
    return [
        serving_cluster(c)
        for c in fleet.clusters
        if c.name in executors and executors[c.name].serves and c.config.gpu_model in known
    ]


def free_devices(fleet, running: pd.DataFrame, names) -> dict[str, dict[str, list[int]]]:
    """Per cluster of `names` and node: the GPU devices no running job holds (a shared device counts as held)."""
    held: dict[tuple[str, str], set[int]] = {}
    if running is not None and len(running) and "node" in running.columns:
        for r in running.itertuples(index=False):
            devices = {int(x) for x in str(getattr(r, "gpu_devices", "") or "").split(",") if x.strip() != ""}
            held.setdefault((str(r.cluster), str(r.node)), set()).update(devices)
    out = {}
    for c in fleet.clusters:
        if c.name not in names:
            continue
        out[c.name] = {
            str(n.sn): [d for d in range(int(n.gpu)) if d not in held.get((c.name, str(n.sn)), set())]
            for n in c.nodes.itertuples(index=False)
        }
    return out


def demand(services: pd.DataFrame, plan_time, data_dir=None, db_path=None) -> pd.DataFrame:
    """Per service: the P90 forecast of hour `plan_time` from its history before it, the last observed hour's demand
    and the demand the hour is provisioned for (tokens/s). Services on one shared source at one scale (not their
    own history) have one history: it is read and forecast once."""
    T = utc(plan_time)
    series, of = {}, {}
    for row in services.to_dict(orient="records"):
        shared = row["rate_source"] != "history"
        key = f"{row['rate_source']}@{float(row.get('rate_scale') or 1.0)!r}" if shared else row["service"]
        of[row["service"]] = key
        if key not in series:
            try:
                h = rate_history(row, T - pd.Timedelta(days=HISTORY_DAYS), T, data_dir=data_dir, db_path=db_path)
            except (OSError, ValueError) as exc:  # fail open: this service goes unplanned, the others are planned
                log.warning("service %s: its rate source cannot be read: %s", row["service"], exc)
                h = pd.DataFrame({"hour_utc": [T - HOUR], "demand_tokens_per_s": [float("nan")]})
            series[key] = h.assign(region=key)
    if not series:
        return pd.DataFrame(columns=["service", "forecast_p90", "last", "wanted", "peak"])
    history = pd.concat(series.values(), ignore_index=True)
    forecaster = service_load_naive(max_horizon=1).fit(history, "demand_tokens_per_s")
    p90 = forecaster.predict(T, 1, history).set_index("region")["p90"]
    figures = {}
    for key, part in history.groupby("region", sort=False):
        known = part["demand_tokens_per_s"].dropna()
        last = float(known.iloc[-1]) if len(known) else float("nan")
        recent = part.loc[part["hour_utc"] >= T - pd.Timedelta(days=PEAK_DAYS), "demand_tokens_per_s"]
        f = float(p90.get(key, float("nan")))
        figures[key] = {
            "forecast_p90": f,
            "last": last,
            "wanted": wanted_demand(f, last),
            "peak": float(recent.max()) if recent.notna().any() else float("nan"),
        }
    return pd.DataFrame([{"service": service, **figures[key]} for service, key in of.items()])


def batch_starts(plan_time, db_path=None) -> dict[str, int]:
    """GPUs per cluster on which the plan of the hour before `plan_time` starts batch jobs in [T, T+1h) (whole GPUs,
    shares rounded up)."""
    T = utc(plan_time)
    with reader(db_path) as con:
        if not (table_exists(con, "plan.assignments") and table_exists(con, "plan.plans")):
            return {}
        rows = con.execute(
            "SELECT a.cluster, ceil(sum(a.gpu_count * a.gpu_milli) / 1000.0) FROM plan.assignments a "
            "JOIN plan.plans p USING (plan_id) WHERE p.plan_time = ? AND a.status = 'tentative' "
            "AND a.start_time >= ? AND a.start_time < ? GROUP BY a.cluster",
            [(T - HOUR).to_pydatetime(), T.to_pydatetime(), (T + HOUR).to_pydatetime()],
        ).fetchall()
    return {str(c): int(n) for c, n in rows}


def previous_provisions(plan_time, db_path=None) -> dict[str, Provision]:
    """The provisions of the latest plan before `plan_time` (within the hour before it): what runs now."""
    with reader(db_path) as con:
        if not table_exists(con, PROVISIONS):
            return {}
        frame = con.execute(
            f"SELECT * FROM {PROVISIONS} WHERE plan_time = ? AND cluster IS NOT NULL",
            [(utc(plan_time) - HOUR).to_pydatetime()],
        ).df()
    return {
        r["service"]: Provision(r["service"], r["cluster"], key_of(r["curve"]), int(r["batch_cap"]),
                                int(r["replicas"]), float(r["planned_tokens_per_s"]), float(r["expected_kgco2e"]))
        for r in frame.to_dict(orient="records")
    }  # fmt: skip


def bind(provision: Provision, free: dict[str, list[int]]) -> list[tuple[str, list[int]]]:
    """First fit of the provision's replicas onto nodes' free devices (consumed): one (node, devices) per replica
    that fits."""
    out = []
    for _ in range(provision.replicas):
        node = next((n for n, devs in free.items() if len(devs) >= provision.key.num_gpus), None)
        if node is None:
            break
        take, free[node] = free[node][: provision.key.num_gpus], free[node][provision.key.num_gpus :]
        out.append((node, take))
    return out


def plan_service_hour(plan_time, plan_id: str, fleet, executors, running, *, horizon_hours: int, db_path=None,
                      data_dir=None, forecasts=None, policy: ServingPolicy | None = None) -> dict:  # fmt: skip
    """The services' hour (see the module doc; `policy`: `plan_services`' settings): {"provisions": frame
    (PROVISION_COLUMNS), "scalings": frame (the changes), "rows": the replicas as running rows for the batch plan,
    "summary": counts}. Writes nothing."""
    T = utc(plan_time)
    services = active_services(T, db_path)
    empty = {"provisions": pd.DataFrame(columns=list(PROVISION_COLUMNS)), "scalings": pd.DataFrame(),
             "rows": pd.DataFrame(), "summary": {"services": 0}}  # fmt: skip
    if services.empty:
        return empty
    clusters = serving_clusters(fleet, executors)
    by_name = {c.name: c for c in clusters}
    model = serving_model(data_dir)
    wants = demand(services, T, data_dir, db_path).set_index("service")
    forecasts = forecasts if forecasts is not None else plan_forecasts(fleet, T, horizon_hours, db_path, data_dir)
    F = forecasts.at(T, 1)[0][0]
    zones = list(fleet.zones)
    intensity = {c.name: float(F[zones.index(c.zone)]) for c in clusters}
    devices = free_devices(fleet, running, set(by_name))
    free = {name: sum(len(d) for d in nodes.values()) for name, nodes in devices.items()}
    previous = previous_provisions(T, db_path)
    specs = {r["service"]: r for r in services.to_dict(orient="records")}
    wanted = {s: float(wants.loc[s, "wanted"]) for s in specs if math.isfinite(float(wants.loc[s, "wanted"]))}
    policy = policy or ServingPolicy()
    room = free
    if policy.yield_to_batch:  # first the GPUs the batch plan does not start jobs on this hour
        starts = batch_starts(T, db_path)
        room = {c: max(0, n - starts.get(c, 0)) for c, n in free.items()}
    plan = plan_services(model, [as_service(r) for r in specs.values()], wanted, clusters, intensity, room, previous,
                         policy)  # fmt: skip
    if room != free and len(plan) < len(wanted):  # the others on any free GPU: their latency target comes first
        left = dict(free)
        for p in plan.values():
            left[p.cluster] -= p.gpus
        rest = [as_service(specs[s]) for s in wanted if s not in plan]
        plan.update(plan_services(model, rest, wanted, clusters, intensity, left, previous, policy))
    # a P90 the free GPUs cannot serve: the hour is provisioned for the recent rule alone (1.25 x the last hour)
    recent = {s: wanted_demand(float("nan"), float(wants.loc[s, "last"])) for s in specs if s not in plan}
    recent = {s: d for s, d in recent.items() if 0 < d < wanted.get(s, float("inf"))}
    if recent:
        left = dict(free)
        for p in plan.values():
            left[p.cluster] -= p.gpus
        more = plan_services(model, [as_service(specs[s]) for s in recent], recent, clusters, intensity, left,
                             previous, policy)  # fmt: skip
        plan.update(more)
        for s, p in more.items():
            wants.loc[s, "wanted"] = p.demand_tokens_per_s
    provisions, rows = [], []
    for name, spec in specs.items():
        p, before, want = plan.get(name), previous.get(name), wants.loc[name]
        record = {
            "plan_id": plan_id,
            "plan_time": T,
            "service": name,
            "tenant": spec["tenant"],
            "service_id": spec["service_id"],
            "latency_slo_ms": float(spec["latency_slo_ms"]),
            "forecast_p90_tokens_per_s": float(want["forecast_p90"]),
            "last_tokens_per_s": float(want["last"]),
            "planned_tokens_per_s": float(want["wanted"]),
            "previous_cluster": None if before is None else before.cluster,
            "previous_replicas": None if before is None else before.replicas,
        }
        if p is None:
            record["explanation"] = _unserved(spec, want, clusters)
            provisions.append(record)
            continue
        placed = bind(p, devices[p.cluster])
        if len(placed) < p.replicas:  # the cluster's free GPUs are split over nodes: fewer replicas fit
            p = Provision(p.service, p.cluster, p.key, p.batch_cap, len(placed), p.demand_tokens_per_s, p.kgco2e)
        cluster = by_name[p.cluster]
        point = at_load(model, p.key, p.demand_tokens_per_s / max(p.replicas, 1), p.batch_cap)
        home = _home_kg(model, as_service(spec), p.demand_tokens_per_s, clusters, intensity, spec["home_region"])
        record.update(
            cluster=p.cluster,
            region=cluster.region,
            zone=cluster.zone,
            curve=curve_id(p.key),
            model=p.key.model,
            gpu=p.key.gpu,
            num_gpus=p.key.num_gpus,
            tensor_parallel=p.key.tensor_parallel,
            batch_cap=p.batch_cap,
            replicas=p.replicas,
            gpus=p.gpus,
            nodes=",".join(n for n, _ in placed),
            predicted_latency_ms=point.latency_ms,
            forecast_gco2_per_kwh=intensity[p.cluster],
            expected_kgco2e=p.kgco2e,
            home_expected_kgco2e=home,
        )
        record["explanation"] = _explain(record, spec)
        provisions.append(record)
        for i, (node, devs) in enumerate(placed):
            rows.append(
                {
                    "job_id": f"service:{name}#{i}",
                    "cluster": p.cluster,
                    "node": node,
                    "gpu_devices": ",".join(str(d) for d in devs),
                    "num_gpu": p.key.num_gpus,
                    "gpu_milli": 1000,
                    "cpu_milli": 0,
                    "memory_mib": 0,
                    # services hold this hour's GPUs over the batch plan's horizon (their later hours are not known),
                    # or over `hold_hours`
                    "end_time": T + int(policy.hold_hours or horizon_hours) * HOUR,
                }
            )
    frame = pd.DataFrame(provisions).reindex(columns=list(PROVISION_COLUMNS))
    scalings = _scalings(frame, previous, specs)
    summary = {
        "services": int(len(specs)),
        "served": int(frame["cluster"].notna().sum()),
        "unserved": sorted(frame.loc[frame["cluster"].isna(), "service"]),
        "gpus": int(frame["gpus"].fillna(0).sum()),
        "scalings": int(len(scalings)),
        "expected_kgco2e": round(float(frame["expected_kgco2e"].fillna(0).sum()), 6),
    }
    return {"provisions": frame, "scalings": scalings, "rows": pd.DataFrame(rows), "summary": summary}


def _home_kg(model, service: Service, wanted: float, clusters, intensity, home_region) -> float | None:
    """The least forecast kgCO2e of serving `wanted` in the home region (None where it has no serving cluster)."""
    home = [c for c in clusters if c.region == home_region and service.runs_on(c.gpu)]
    best = plan_services(model, [service], {service.name: wanted}, home, intensity, {c.name: c.gpus for c in home})
    return best[service.name].kgco2e if service.name in best else None


def _explain(r: dict, spec: dict) -> str:
    """One sentence on the hour's provision of a service."""
    moved = r["previous_cluster"] is not None and r["previous_cluster"] != r["cluster"]
    change = (
        f"moved from {r['previous_cluster']}" if moved
        else "new" if r["previous_cluster"] is None
        else f"{r['previous_replicas']} -> {r['replicas']} replicas"
    )  # fmt: skip
    home = r["home_expected_kgco2e"]
    versus = f"; in its home region {spec['home_region']}: {home:.4f} kg" if home is not None else ""
    return (
        f"{r['replicas']} x {r['num_gpus']} {r['gpu']} in {r['cluster']} ({change}), batch cap {r['batch_cap']}, "
        f"for {r['planned_tokens_per_s']:.0f} tokens/s (forecast P90 {r['forecast_p90_tokens_per_s']:.0f}, last hour "
        f"{r['last_tokens_per_s']:.0f}): predicted latency {r['predicted_latency_ms']:.1f} ms within "
        f"{r['latency_slo_ms']:g} ms; forecast {r['forecast_gco2_per_kwh']:.0f} gCO2/kWh, "
        f"{r['expected_kgco2e']:.4f} kg this hour{versus}"
    )


def _unserved(spec: dict, want, clusters) -> str:
    allowed = [c.name for c in clusters if as_service(spec).allows(c.region) and as_service(spec).runs_on(c.gpu)]
    if not allowed:
        return "no cluster of its allowed regions and GPU models runs services"
    if not math.isfinite(float(want["wanted"])):
        return "no demand known: its rate source has no hour before this one"
    return f"no configuration serves {want['wanted']:.0f} tokens/s within its target on the free GPUs of {allowed}"


def _scalings(frame: pd.DataFrame, previous: dict[str, Provision], specs: dict) -> pd.DataFrame:
    """The hour's changes: per service and cluster whose replicas or configuration differ from the last hour's
    (a cluster it leaves gets 0 replicas)."""
    rows = []
    for r in frame.to_dict(orient="records"):
        name, before, spec = r["service"], previous.get(r["service"]), specs[r["service"]]
        base = {"service": name, "tenant": spec["tenant"], "service_id": spec["service_id"],
                "latency_slo_ms": float(spec["latency_slo_ms"]), "rate_source": spec["rate_source"],
                "rate_scale": float(spec.get("rate_scale") or 1.0), "task": spec["task"]}  # fmt: skip
        now = r["cluster"] if isinstance(r["cluster"], str) else None
        if before is not None and before.cluster != now:
            k = before.key
            rows.append({**base, "job_id": f"{name}@{before.cluster}", "cluster": before.cluster,
                         "from_replicas": before.replicas, "replicas": 0, "num_gpus": k.num_gpus,
                         "tensor_parallel": k.tensor_parallel, "batch_cap": before.batch_cap, "model": k.model,
                         "gpu": k.gpu, "curve": curve_id(k), "nodes": ""})  # fmt: skip
        if now is None:
            continue
        same = (
            before is not None and before.cluster == now and before.replicas == r["replicas"]
            and before.batch_cap == r["batch_cap"] and curve_id(before.key) == r["curve"]
        )  # fmt: skip
        if not same:
            rows.append({**base, "job_id": f"{name}@{now}", "cluster": now,
                         "from_replicas": before.replicas if before is not None and before.cluster == now else 0,
                         **{k: r[k] for k in ("replicas", "num_gpus", "tensor_parallel", "batch_cap", "model", "gpu",
                                              "curve", "nodes")}})  # fmt: skip
    return pd.DataFrame(rows)


def write_service_hour(result: dict, plan_id: str, executors, db_path=None) -> dict:
    """Write the hour's provisions (once per plan: a re-run keeps the first) and its scalings as intents."""
    frame = result["provisions"]
    if frame.empty:
        return {"provisions": 0, "scalings": 0}
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            if con.execute(f"SELECT count(*) FROM {PROVISIONS} WHERE plan_id = ?", [plan_id]).fetchone()[0]:
                con.execute("ROLLBACK")
                return {"provisions": 0, "scalings": 0}
            con.register("_provisions", frame)
            con.execute(f"INSERT INTO {PROVISIONS} BY NAME SELECT * FROM _provisions")
            con.unregister("_provisions")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    written = record_scalings(plan_id, result["scalings"], executors, db_path) if len(result["scalings"]) else 0
    return {"provisions": int(len(frame)), "scalings": int(written)}


def read_provisions(plan_time, db_path=None) -> pd.DataFrame:
    """The provisions planned for hour `plan_time` (PROVISION_COLUMNS); empty when none."""
    with reader(db_path) as con:
        if not table_exists(con, PROVISIONS):
            return pd.DataFrame(columns=list(PROVISION_COLUMNS))
        return con.execute(
            f"SELECT * FROM {PROVISIONS} WHERE plan_time = ? ORDER BY service", [utc(plan_time).to_pydatetime()]
        ).df()


def with_counterfactual(usage: pd.DataFrame, fleet, db_path=None, data_dir=None) -> pd.DataFrame:
    """The executors' served hours (`SERVICE_USAGE_COLUMNS`) with what values them (the cluster's zone and PUE, the
    target) and the static counterfactual's hour: the service provisioned for the peak of the `PEAK_DAYS` before
    the hour in its home region (the cheapest cluster there with a GPU it may use: smallest replica, default batch
    cap and power limit), serving the same demand (`planning.serving.serve`)."""
    if usage is None or usage.empty:
        return usage
    model = serving_model(data_dir)
    clusters = {c.name: c for c in fleet.clusters}
    known = {k.gpu for k in model.keys()}
    specs = active_services(usage["hour_utc"].max(), db_path).set_index("service")
    out = []
    for r in usage.to_dict(orient="records"):
        c = clusters.get(r["cluster"])
        r.update(region=None if c is None else c.config.region, zone=None if c is None else c.config.zone,
                 pue=1.2 if c is None else c.config.pue)  # fmt: skip
        if r["service"] in specs.index:
            spec = specs.loc[r["service"]].to_dict() | {"service": r["service"]}
            service = as_service(spec)
            r["latency_slo_ms"] = service.slo_ms
            home = [
                serving_cluster(h)
                for h in fleet.clusters
                if h.config.region == service.home_region and h.config.gpu_model in known
                and service.runs_on(h.config.gpu_model)
            ]  # fmt: skip
            hour = utc(r["hour_utc"])
            rates = rate_history(spec, hour - pd.Timedelta(days=PEAK_DAYS), hour + HOUR, data_dir=data_dir,
                                 db_path=db_path)["demand_tokens_per_s"]  # fmt: skip
            peak = float(np.nanmax(rates.to_numpy())) if rates.notna().any() else float(r["demand_tokens_per_s"])
            if home:
                h = home[0]
                p = static_provision(model, service, peak, h)
                got = serve(model, p, float(r["demand_tokens_per_s"]), service.slo_ms, h.pue, 0.0)
                r.update(static_cluster=h.name, static_zone=h.zone, static_gpus=p.gpus, static_tokens=got["tokens"],
                         static_kwh=got["kwh"], static_latency_ms=got["latency_ms"],
                         static_saturated=got["saturated"])  # fmt: skip
        out.append(r)
    return pd.DataFrame(out)


def any_services(db_path=None) -> bool:
    """Whether any service was ever submitted (the loop skips the services' steps otherwise)."""
    with reader(db_path) as con:
        return (
            table_exists(con, "queue.services") and con.execute("SELECT count(*) FROM queue.services").fetchone()[0] > 0
        )


def service_replicas(db_path=None) -> pd.DataFrame:
    """The loop's service replicas as held capacity (`scheduling.evaluation.simulator.simulate`'s `held`): per
    provision and replica its cluster, node (the provision's nodes in turn), GPUs and hour; empty without
    services."""
    with reader(db_path) as con:
        if not table_exists(con, PROVISIONS):
            return pd.DataFrame()
        frame = con.execute(
            f"SELECT plan_time, service, cluster, nodes, num_gpus, replicas FROM {PROVISIONS} "
            "WHERE cluster IS NOT NULL AND replicas > 0 ORDER BY plan_time, service"
        ).df()
    rows = []
    for r in frame.itertuples(index=False):
        nodes = [n for n in str(r.nodes or "").split(",") if n]
        start = pd.Timestamp(r.plan_time).tz_convert("UTC")
        for i in range(int(r.replicas)):
            rows.append({"job_id": f"service:{r.service}#{i}@{start:%Y%m%dT%H}", "cluster": r.cluster,
                         "node": nodes[i] if i < len(nodes) else None, "num_gpu": int(r.num_gpus), "gpu_milli": 1000,
                         "start_time": start, "end_time": start + pd.Timedelta(hours=1)})  # fmt: skip
    return pd.DataFrame(rows)
