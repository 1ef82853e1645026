"""The serving model against the ML.ENERGY files read here with the csv module: the units of each source, a
measured cap returns the measurement, a cap between two returns the log-log interpolation computed by hand, every
configuration the data lacks is refused naming it, and the leave-one-configuration-out error is recomputed for one
curve by hand and meets the < 10 % targets on the language tasks."""

from __future__ import annotations

import csv
import math

import pytest

from scheduling.evaluation.serving_eval import leave_one_configuration_out, summary
from scheduling.models.serving import (
    V2_RUNS,
    V3_RUNS,
    ServingKey,
    ServingModel,
    UnknownServingConfiguration,
    load_serving_runs,
)


@pytest.fixture(scope="module")
def runs(data_dir):
    return load_serving_runs(data_dir)


@pytest.fixture(scope="module")
def model(runs):
    return ServingModel().fit(runs)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _curve(rows, **match):
    out = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return sorted(out, key=lambda r: float(r.get("Max BS (reqs)") or r.get("max_num_seqs")))


def test_every_run_is_loaded_in_its_units(runs, data_dir):
    v2, v3 = _rows(data_dir / V2_RUNS), _rows(data_dir / V3_RUNS)
    assert len(runs) == len(v2) + len(v3) - 3  # three v3 configurations were run twice: one row each
    first = v2[0]
    key = ServingKey("mlenergy-v2", first["task"], first["Model"], "A100", int(first["TP"]) * int(first["PP"]),
                     int(first["TP"]))  # fmt: skip
    point = ServingModel().fit(runs).predict(key, int(first["Max BS (reqs)"]))
    assert point.measured and point.latency_kind == "mean_tpot"
    assert point.joules_per_token == pytest.approx(float(first["Energy/req (J)"]) / float(first["Avg Output Tokens"]))
    assert point.latency_ms == pytest.approx(1000 * float(first["Avg TPOT (s)"]))
    assert point.tokens_per_s == pytest.approx(float(first["Token tput (tok/s)"]))
    assert point.power_w == pytest.approx(point.tokens_per_s * point.joules_per_token)


def test_a_cap_between_two_measured_ones_is_the_log_log_line_between_them(model, data_dir):
    v3 = _rows(data_dir / V3_RUNS)
    curve = _curve(v3, task="lm-arena-chat", model_id="Qwen/Qwen3-14B", gpu_model="H100", num_gpus="1")
    lo, hi = curve[3], curve[4]
    b0, b1 = float(lo["max_num_seqs"]), float(hi["max_num_seqs"])
    cap = (b0 + b1) / 2
    w = (math.log(cap) - math.log(b0)) / (math.log(b1) - math.log(b0))
    key = ServingKey("mlenergy-v3", "lm-arena-chat", "Qwen/Qwen3-14B", "H100", 1, 1, 1)
    point = model.predict(key, cap)
    for attr, column in (("joules_per_token", "energy_per_token_joules"), ("latency_ms", "p90_itl_ms"),
                         ("tokens_per_s", "output_throughput_tokens_per_sec")):  # fmt: skip
        by_hand = math.exp((1 - w) * math.log(float(lo[column])) + w * math.log(float(hi[column])))
        assert getattr(point, attr) == pytest.approx(by_hand, rel=1e-12)
    assert not point.measured and point.latency_kind == "p90_itl"


def test_what_the_data_lacks_is_refused_naming_it(model):
    key = ServingKey("mlenergy-v3", "lm-arena-chat", "Qwen/Qwen3-14B", "H100", 1, 1, 1)
    caps = model.batch_caps(key)
    with pytest.raises(UnknownServingConfiguration, match=f"batch cap {caps[-1] * 2} is outside"):
        model.predict(key, caps[-1] * 2)
    with pytest.raises(UnknownServingConfiguration, match="power limit 200 W"):
        model.predict(key, caps[0], power_limit_w=200)
    with pytest.raises(UnknownServingConfiguration, match="no serving data.*V100"):
        model.predict(ServingKey("mlenergy-v3", "lm-arena-chat", "Qwen/Qwen3-14B", "V100", 1, 1, 1), caps[0])


def test_leave_one_configuration_out_by_hand_for_one_curve_and_the_targets(runs, data_dir):
    errors = leave_one_configuration_out(runs)
    assert len(errors) == len(runs)
    curve = _curve(_rows(data_dir / V3_RUNS), task="lm-arena-chat", model_id="Qwen/Qwen3-14B", gpu_model="H100",
                   num_gpus="1")  # fmt: skip
    key = {"model": "Qwen/Qwen3-14B", "gpu": "H100", "task": "lm-arena-chat", "num_gpus": 1}
    mine = errors[(errors[list(key)] == list(key.values())).all(axis=1)].sort_values("batch_cap")
    assert mine["refused"].tolist() == [True] + [False] * (len(curve) - 2) + [True]  # the ends: nothing to span them
    for i in range(1, len(curve) - 1):
        x = [math.log(float(r["max_num_seqs"])) for r in curve]
        y = [math.log(float(r["energy_per_token_joules"])) for r in curve]
        w = (x[i] - x[i - 1]) / (x[i + 1] - x[i - 1])
        predicted = math.exp((1 - w) * y[i - 1] + w * y[i + 1])
        assert mine["joules_per_token_error"].iat[i] == pytest.approx(abs(predicted / math.exp(y[i]) - 1))
    result = summary(errors)
    assert result["targets"] == {"energy_per_token_lt_10pct": True, "latency_lt_10pct": True}
    assert result["language"]["scored"] + result["language"]["refused"] == errors["task"].isin(
        result["language_tasks"]).sum()  # fmt: skip


def test_a_replica_runs_at_the_point_whose_throughput_is_its_demand(model):
    from scheduling.models.serving import at_load

    key = ServingKey("mlenergy-v3", "lm-arena-chat", "Qwen/Qwen3-14B", "H100", 1, 1, 1)
    caps = model.batch_caps(key)
    t = {c: model.predict(key, c).tokens_per_s for c in caps}
    assert all(t[a] < t[b] for a, b in zip(caps, caps[1:]))  # this curve's throughput rises with the cap
    # halfway (in log) between the throughputs of two caps: halfway (in log) between the caps
    lo, hi = caps[1], caps[2]
    demand = math.sqrt(t[lo] * t[hi])
    point = at_load(model, key, demand, caps[-1])
    at = model.predict(key, math.sqrt(lo * hi))
    assert point.latency_ms == pytest.approx(at.latency_ms) and point.joules_per_token == pytest.approx(
        at.joules_per_token
    )
    assert point.power_w == pytest.approx(demand * at.joules_per_token) and not point.saturated
    assert point.utilization == pytest.approx(demand / t[caps[-1]])
    # at the cap's throughput or above: saturated, serving only that
    full = at_load(model, key, 2 * t[caps[3]], caps[3])
    assert full.saturated and full.served_tokens_per_s == pytest.approx(t[caps[3]])
    # below the smallest measured load: the smallest cap's draw, so the energy per token grows
    small = model.predict(key, caps[0])
    idle = at_load(model, key, t[caps[0]] / 4, caps[-1])
    assert idle.power_w == pytest.approx(small.power_w) and idle.joules_per_token == pytest.approx(
        4 * small.joules_per_token
    )
