"""Services' hourly capacity (`scheduling.planning.serving`) on the fitted serving model: a replica's limit by hand,
the cheapest allowed cluster chosen, the GPUs a cluster has respected, no move for a small saving, GPUs shed
gradually (also by moving); the evaluation against static provisioning on ServeGen's days, its carbon recomputed
from the grid marts' actual intensity and its totals from its own hours."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scheduling.models.serving import ServingKey, at_load, fit_serving_model
from scheduling.planning.serving import (
    Service,
    ServingCluster,
    ServingPolicy,
    plan_services,
    replica_limit,
)

KEY = ServingKey("mlenergy-v3", "lm-arena-chat", "meta-llama/Llama-3.1-8B-Instruct", "H100", 1, 1, 1)
SMALL = Service("s", KEY.model, "H100", 30.0, "a", ("a", "b"))
A, B, C = (ServingCluster(n, n, n, "H100", 64, 1.2) for n in ("a", "b", "c"))


@pytest.fixture(scope="module")
def model(data_dir):
    return fit_serving_model(data_dir)


def test_a_replicas_limit_is_the_largest_load_within_the_target(model):
    caps = model.batch_caps(KEY)
    points = [model.predict(KEY, c) for c in caps]
    reach, best = 0.0, 0.0
    for p in points:  # by hand: the running maximum of throughput over the caps whose latency is within 30 ms
        reach = max(reach, p.tokens_per_s)
        best = reach if p.latency_ms <= 30.0 else best
    assert 0 < best < reach
    assert replica_limit(model, KEY, caps[-1], 30.0, 1.0) == pytest.approx(best)
    assert replica_limit(model, KEY, caps[-1], 30.0, 0.5) == pytest.approx(min(best, 0.5 * points[-1].tokens_per_s))
    assert replica_limit(model, KEY, caps[-1], 1.0, 1.0) == 0.0  # no load is that fast


def test_the_cheapest_allowed_cluster_with_room_is_chosen(model):
    demand = 20_000.0
    clean = {"a": 300.0, "b": 100.0, "c": 10.0}  # c is cleanest but not allowed
    plan = plan_services(model, [SMALL], {"s": demand}, [A, B, C], clean, {"a": 64, "b": 64, "c": 64})
    p = plan["s"]
    assert p.cluster == "b"
    limit = replica_limit(model, KEY, p.batch_cap, 30.0, ServingPolicy().headroom)
    assert p.replicas == math.ceil(demand / limit)
    point = at_load(model, KEY, demand / p.replicas, p.batch_cap)
    assert p.kgco2e == pytest.approx(p.replicas * point.power_w / 1000 * 1.2 * 100.0 / 1000)
    # b has no room for it: a
    plan = plan_services(model, [SMALL], {"s": demand}, [A, B, C], clean, {"a": 64, "b": p.gpus - 1, "c": 64})
    assert plan["s"].cluster == "a"


def test_a_service_moves_only_for_a_real_saving_and_sheds_replicas_gradually(model):
    before = plan_services(model, [SMALL], {"s": 40_000.0}, [A, B], {"a": 100.0, "b": 300.0}, {"a": 64, "b": 64})
    assert before["s"].cluster == "a"
    # b is now 5 % cleaner than a: not worth a move (10 %)
    plan = plan_services(model, [SMALL], {"s": 40_000.0}, [A, B], {"a": 100.0, "b": 95.0}, {"a": 64, "b": 64}, before)
    assert plan["s"].cluster == "a"
    # the demand falls to a tenth: at most a quarter of the replicas go in one hour
    low = plan_services(model, [SMALL], {"s": 4_000.0}, [A, B], {"a": 100.0, "b": 300.0}, {"a": 64, "b": 64}, before)
    assert model.keys(model=KEY.model, gpu="H100", task=KEY.task) == [KEY]  # one serving curve: GPUs = replicas
    assert before["s"].replicas >= 4 and low["s"].replicas == math.ceil(0.75 * before["s"].replicas)
    assert low["s"].cluster == "a"  # where it is cleaner, now that b cannot take it with fewer GPUs


def test_the_services_evaluation_against_static_provisioning(data_dir, tmp_path):
    from forecasting.data import grid_hourly
    from scheduling.evaluation.services import SERVICES, evaluate_services, serving_clusters

    # no warehouse: the intensity forecasts are the published ones in the files (as `services-eval` on a fresh clone)
    result = evaluate_services(data_dir=data_dir, db_path=tmp_path / "empty.duckdb")
    hours = result["hours"]
    served = hours[~hours["unserved"].astype(bool)]
    # one row's carbon from the grid marts' actual intensity of its cluster's zone and hour
    row = served.iloc[len(served) // 2]
    zone = next(c.zone for c in serving_clusters() if c.name == row["cluster"])
    grid = grid_hourly([zone], start=row["hour"], end=row["hour"] + pd.Timedelta(hours=1), data_dir=data_dir)
    ci = float(grid.loc[grid["hour_utc"] == row["hour"], "carbon_intensity_direct_gco2_per_kwh"].iloc[0])
    assert row["kgco2e"] == pytest.approx(row["kwh"] * ci / 1000.0)
    total = result["services"]["all"]
    assert total["planned"]["kgco2e"] == pytest.approx(served["kgco2e"].sum())
    assert total["planned"]["g_per_1k_tokens"] == pytest.approx(1e6 * served["kgco2e"].sum() / served["tokens"].sum())
    assert set(result["services"]) == {s.name for s in SERVICES} | {"all"}
    # the targets: >= 40 % less carbon per 1k tokens than static, the latency target in >= 99 % of service-hours
    assert total["reduction_pct"] >= 40.0 and total["planned"]["slo_attainment_pct"] >= 99.0
    from scheduling.evaluation.services import plot_services

    png = plot_services(hours, tmp_path / "services.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
