"""Capacity of inference services for one hour: per service, the cluster, serving configuration (GPUs per replica,
batch cap) and replica count that serve its forecast load within its latency target at the least forecast carbon.

A replica is planned to carry at most `replica_limit` tokens/s: the largest demand at which the serving model
(`scheduling.models.serving.at_load`) keeps its latency within the target, and at most `headroom` of the cap's
throughput (the load varies within the hour). Replicas = ceil(demand / limit), at least `min_replicas`; their draw is
the model's at the demand each one carries, times the cluster's PUE; the forecast carbon is that draw x the hour's
forecast intensity of the cluster's zone. Services are placed largest demand first, each on the cheapest option
that fits the cluster's free GPUs. Against thrashing: a service stays on the cluster it is on unless another saves
at least `move_saving` of the carbon, and sheds at most `max_shed` of its GPUs in one hour, wherever it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduling.models.serving import ServingKey, ServingModel, UnknownServingConfiguration, at_load

HEADROOM = 0.85
MEMO_LIMIT = 10_000  # entries kept per memo before it starts again (a long simulation asks for many demands)
RECENT_MARGIN = 1.25  # an hour is provisioned for at least this much over the last observed hour's demand
DEFAULT_BATCH = 256  # the static counterfactual's batch cap: vLLM's default max_num_seqs (the nearest measured cap)


@dataclass(frozen=True)
class Service:
    """An inference service: the model it serves (a model id the serving data knows) on `gpu`, its latency target
    (ms per output token, of the data's latency kind), its home and allowed regions (empty: any) and its floor."""

    name: str
    model: str
    gpu: str
    slo_ms: float
    home_region: str
    allowed_regions: tuple[str, ...] = ()
    min_replicas: int = 1
    task: str = "lm-arena-chat"
    gpu_models: tuple[str, ...] = ()  # GPU models its replicas may use (empty: any the serving data has)

    def allows(self, region: str) -> bool:
        return not self.allowed_regions or region in self.allowed_regions

    def runs_on(self, gpu: str) -> bool:
        return not self.gpu_models or gpu in self.gpu_models


@dataclass(frozen=True)
class ServingCluster:
    """GPUs of one type in one region (its grid zone) that services may use."""

    name: str
    region: str
    zone: str
    gpu: str
    gpus: int
    pue: float = 1.2


@dataclass(frozen=True)
class Provision:
    """A service's hour: where, how (serving curve, batch cap), how many replicas, and the forecast carbon."""

    service: str
    cluster: str
    key: ServingKey
    batch_cap: int
    replicas: int
    demand_tokens_per_s: float
    kgco2e: float

    @property
    def gpus(self) -> int:
        return self.replicas * self.key.num_gpus


@dataclass(frozen=True)
class ServingPolicy:
    """Settings of `plan_services` (see the module doc)."""

    headroom: float = HEADROOM
    move_saving: float = 0.10
    max_shed: float = 0.25
    # the loop's side (scheduling/service_hours.py): leave a cluster's GPUs that the last batch plan starts jobs on
    # this hour to those jobs where another cluster can serve; hold replicas in the batch plan for this many hours
    # (None: the plan's whole horizon). Measured beside 7 days of jobs: the fleet's carbon -4.6 %, the jobs' saving
    # 66.8 % instead of 57.1 %, deadlines no worse (docs/results/planner/services.md).
    yield_to_batch: bool = True
    hold_hours: int | None = 1


def replica_limit(model: ServingModel, key: ServingKey, batch_cap: int, slo_ms: float, headroom: float) -> float:
    """The largest demand (tokens/s) one replica at `batch_cap` carries within `slo_ms`, at most `headroom` of the
    cap's throughput; 0 where no load meets the target. The latency rises with the demand along the curve, so the
    limit is the largest measured operating point within the target (or the cap's own). Memoized per model: every
    service and cluster of an hour asks again."""
    memo = model.derived.setdefault("replica_limit", {})
    args = (key, int(batch_cap), float(slo_ms), float(headroom))
    if args not in memo:
        memo[args] = _replica_limit(model, *args)
    return memo[args]


def _replica_limit(model: ServingModel, key: ServingKey, batch_cap: int, slo_ms: float, headroom: float) -> float:
    caps = [c for c in model.batch_caps(key) if c <= batch_cap]
    best = 0.0
    reach = 0.0
    for c in caps:
        point = model.predict(key, c)
        reach = max(reach, point.tokens_per_s)
        if point.latency_ms <= slo_ms:
            best = reach
    return min(best, headroom * model.predict(key, batch_cap).tokens_per_s)


def options(model: ServingModel, service: Service, demand: float, cluster: ServingCluster, ci: float, policy):
    """Every (kgCO2e, key, batch cap, replicas) that serves `demand` on `cluster` within the target, at intensity
    `ci` (gCO2e/kWh)."""
    return [
        (n * power_w / 1000.0 * cluster.pue * ci / 1000.0, key, cap, n)
        for key, cap, n, power_w in _sized(model, service, demand, cluster.gpu, policy.headroom)
    ]


def _sized(model: ServingModel, service: Service, demand: float, gpu: str, headroom: float) -> list[tuple]:
    """Every (key, batch cap, replicas, draw per replica in W) that serves `demand` on `gpu` within the target.
    Memoized per model (bounded): services of one model and target share the answer, whatever the cluster."""
    memo = model.derived.setdefault("sized", {})
    args = (service.model, gpu, service.task, float(service.slo_ms), int(service.min_replicas), float(demand), headroom)
    if args in memo:
        return memo[args]
    out = []
    for key in model.keys(model=service.model, gpu=gpu, task=service.task):
        for cap in model.batch_caps(key):
            limit = replica_limit(model, key, cap, service.slo_ms, headroom)
            if limit <= 0:
                continue
            n = max(service.min_replicas, math.ceil(demand / limit - 1e-9))
            try:
                point = at_load(model, key, demand / n, cap)
            except UnknownServingConfiguration:
                continue
            out.append((key, int(cap), n, point.power_w))
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[args] = out
    return out


def plan_services(
    model: ServingModel,
    services: list[Service],
    demand: dict[str, float],
    clusters: list[ServingCluster],
    intensity: dict[str, float],
    free_gpus: dict[str, int],
    previous: dict[str, Provision] | None = None,
    policy: ServingPolicy | None = None,
) -> dict[str, Provision]:
    """The hour's provision of every service (see the module doc). `demand`: forecast tokens/s per service;
    `intensity`: forecast gCO2e/kWh per cluster for the hour; `free_gpus`: per cluster (consumed here); `previous`:
    the last hour's provisions. A service no cluster can serve within its target is left out (the caller reports it)."""
    previous, policy = previous or {}, policy or ServingPolicy()
    free = dict(free_gpus)
    out: dict[str, Provision] = {}
    for service in sorted(services, key=lambda s: -demand.get(s.name, 0.0)):
        d = max(float(demand.get(service.name, 0.0)), 0.0)
        before = previous.get(service.name)
        floor_gpus = before.gpus * (1.0 - policy.max_shed) if before is not None else 0.0
        choices = []
        for cluster in clusters:
            if not service.allows(cluster.region) or not service.runs_on(cluster.gpu):
                continue
            ci = intensity[cluster.name]
            for kg, key, cap, n in options(model, service, d, cluster, ci, policy):
                floor = math.ceil(floor_gpus / key.num_gpus - 1e-9)
                if n < floor:  # shed at most `max_shed` of the GPUs: each replica carries less, at its own draw
                    n = floor
                    kg = n * at_load(model, key, d / n, cap).power_w / 1000.0 * cluster.pue * ci / 1000.0
                if n * key.num_gpus <= free.get(cluster.name, 0):
                    choices.append((kg, cluster.name, key, cap, n))
        if not choices:
            continue
        best = min(choices, key=lambda c: c[0])
        if before is not None:
            stay = [c for c in choices if c[1] == before.cluster]
            if stay and min(stay, key=lambda c: c[0])[0] * (1.0 - policy.move_saving) <= best[0]:
                best = min(stay, key=lambda c: c[0])
        kg, name, key, cap, n = best
        free[name] -= n * key.num_gpus
        out[service.name] = Provision(service.name, name, key, cap, n, d, kg)
    return out


def wanted_demand(forecast_p90: float, last_observed: float, margin: float = RECENT_MARGIN) -> float:
    """The demand (tokens/s) an hour is provisioned for: the forecast P90, or `margin` x the last observed hour's
    demand where that is more (bursts outlast a day-ahead forecast); the latter alone where there is no forecast."""
    recent = margin * last_observed if math.isfinite(last_observed) else 0.0
    return max(forecast_p90, recent) if math.isfinite(forecast_p90) else recent


def static_provision(model: ServingModel, service: Service, peak: float, cluster: ServingCluster) -> Provision:
    """The counterfactual: `cluster` (the home region's), the smallest replica, the default batch cap
    (`DEFAULT_BATCH`, the nearest measured), the GPUs' default power limit, replicas for `peak` tokens/s."""
    key = min(model.keys(model=service.model, gpu=cluster.gpu, task=service.task), key=lambda k: k.num_gpus)
    caps = model.batch_caps(key)
    cap = min(caps, key=lambda c: (abs(math.log(c / DEFAULT_BATCH)), c))
    limit = replica_limit(model, key, cap, service.slo_ms, ServingPolicy().headroom)
    if limit <= 0:  # no load meets the target at this cap: sized by throughput alone
        limit = ServingPolicy().headroom * model.predict(key, cap).tokens_per_s
    n = max(service.min_replicas, math.ceil(peak / limit - 1e-9))
    return Provision(service.name, cluster.name, key, int(cap), n, peak, float("nan"))


def serve(model: ServingModel, p: Provision, demand: float, slo_ms: float, pue: float, ci: float) -> dict:
    """One hour of provision `p` at the actual `demand` (tokens/s) and intensity `ci` (gCO2e/kWh): output tokens
    served, kWh (PUE included), kgCO2e, the latency at the load each replica carries, whether a replica saturated
    and whether the target held (none saturated, latency within `slo_ms`)."""
    point = at_load(model, p.key, demand / p.replicas, p.batch_cap)
    kwh = p.replicas * point.power_w / 1000.0 * pue
    return {
        "tokens": point.served_tokens_per_s * p.replicas * 3600.0,
        "kwh": kwh,
        "kgco2e": kwh * ci / 1000.0,
        "slo_met": (not point.saturated) and point.latency_ms <= slo_ms,
        "latency_ms": point.latency_ms,
        "saturated": bool(point.saturated),
    }
