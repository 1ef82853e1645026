"""The simulator on real data (2 days, 50 jobs, 6 regions), forecast providers, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scheduling.evaluation.results import evaluate, report_markdown
from scheduling.evaluation.scenario import build_scenario
from scheduling.evaluation.simulator import run_now, simulate
from scheduling.planning.forecasts import GridSeries, NaiveForecast, PublishedForecast, make_forecasts

START = "2021-07-05"


@pytest.fixture(scope="module")
def scenario(data_dir):
    return build_scenario(
        start=START,
        days=2,
        n_jobs=50,
        regions=6,
        load=0.5,
        seed=3,
        forecasts="dacf",
        data_dir=data_dir,
        grid_source="files",
        tail_days=4,
    )


@pytest.fixture(scope="module")
def report(scenario):
    return evaluate(scenario)


def test_report_shape_and_metrics(report, scenario):
    json.dumps(report)
    pol = report["policies"]
    assert set(pol) == {
        "priority",
        "rolling-lp",
        "performance-first",
        "greedy-carbon",
        "carbon-time",
        "round-robin",
        "random",
    }
    assert report["forecasts"]["used"] == "dacf"
    assert report["signal"].startswith("average, production-based, direct")
    assert len(report["fleet"]["clusters"]) == 6
    for m in pol.values():
        assert m["jobs_started"] + m["jobs_never_started"] == len(scenario.jobs)
        assert 0 <= m["deadline_satisfaction"] <= 1
        assert 0 <= m["renewable_share"] <= 1
        assert m["kgco2e"] > 0 and m["energy_kwh"] > 0
        assert m["unallocated_gpus"] >= 0
    assert pol["performance-first"]["reduction_vs_performance_first_pct"] == 0
    opt = report["optimum"]
    assert opt["lp"]["status"] == "optimal"
    for name, m in pol.items():
        if m["deadline_satisfaction"] == 1.0:  # the bound holds for every schedule meeting the deadlines
            assert opt["kgco2e"] <= m["kgco2e"] + 1e-6, name
    assert opt["share_of_optimum_reduction_pct"] == 100.0
    assert pol["priority"]["kgco2e"] < pol["performance-first"]["kgco2e"]
    assert pol["priority"]["deadline_satisfaction"] >= 0.98
    assert pol["rolling-lp"]["kgco2e"] < pol["performance-first"]["kgco2e"]
    assert pol["rolling-lp"]["deadline_satisfaction"] >= 0.98
    md = report_markdown([report])
    assert "| priority |" in md and "optimum (bound)" in md and "Fleet capacity per region" in md


def test_simulation_is_deterministic_and_capacity_respected(scenario):
    a = simulate(scenario, "priority")
    b = simulate(scenario, "priority")
    pd.testing.assert_frame_equal(a.records, b.records)
    cap = scenario.fleet.capacity_milli
    assert (a.hourly_alloc <= cap[None, :]).all()
    rec = a.records[a.records["started"]]
    assert (rec["delay_h"] >= 0).all()
    # energy and carbon recomputed from the actual intensity
    t0, ci = scenario.actual("ci")
    j = rec.index[0]
    c = scenario.fleet.names.index(rec.loc[j, "cluster"])
    s = int(rec.loc[j, "start_time"].value // 3_600_000_000_000) - t0
    d = rec.loc[j, "duration_h"]
    k = int(rec.loc[j, "power_option"])
    kw = scenario.table.kw[j, k, c]
    whole = int(np.floor(d + 1e-9))
    expect = kw * (ci[s : s + whole, c].sum() + (d - whole) * ci[s + whole, c]) / 1000.0
    home = scenario.table.home[j]
    expect += scenario.table.transfer_kwh[j, c] * 0.5 * (ci[s, home] + ci[s, c]) / 1000.0
    assert rec.loc[j, "kgco2e"] == pytest.approx(expect, rel=1e-9)


def test_grid_and_naive_forecast(data_dir):
    g = GridSeries.load(["CISO", "SE"], "2021-07-01", "2021-07-10", source="files", data_dir=data_dir)
    now = pd.Timestamp("2021-07-03T05:00Z")
    naive = NaiveForecast(g, ["CISO", "SE"])
    F, version, meta = naive.at(now, 30)
    i = g.index(now)
    # the next 24 h: same hour yesterday; later hours repeat that day
    np.testing.assert_allclose(F[:24], g.ci[i - 24 : i])
    np.testing.assert_allclose(F[24:30], g.ci[i - 24 : i - 18])
    assert meta["fallback_share"] == 1.0 and version.startswith("naive-24")


def test_dacf_forecast_known_only_for_the_day(data_dir):
    g = GridSeries.load(["CISO", "MISO"], "2021-07-01", "2021-07-10", source="files", data_dir=data_dir)
    fc = make_forecasts("dacf", g, ["CISO", "MISO"], start="2021-07-02", end="2021-07-10", data_dir=data_dir)
    assert isinstance(fc, PublishedForecast)
    now = pd.Timestamp("2021-07-03T20:00Z")
    F, version, meta = fc.at(now, 10)
    naive, _, _ = NaiveForecast(g, ["CISO", "MISO"]).at(now, 10)
    # CISO: DACF for 20:00..23:00 (4 h), naive after; MISO has no DACF series: naive throughout
    assert not np.allclose(F[:4, 0], naive[:4, 0])
    np.testing.assert_allclose(F[4:, 0], naive[4:, 0])
    np.testing.assert_allclose(F[:, 1], naive[:, 1])
    assert meta["fallback_share"] == pytest.approx(1 - 4 / 20)


def test_warehouse_forecasts_are_read(tmp_warehouse, data_dir):
    from forecasting.store import write_forecasts

    issued = pd.Timestamp("2021-07-03T00:00Z")
    targets = issued + pd.to_timedelta(np.arange(48), unit="h")
    rows = pd.DataFrame(
        {
            "issued_at": issued,
            "target_time": targets,
            "region": "CISO",
            "target": "carbon_intensity",
            "p10": 90.0,
            "p50": 100.0 + np.arange(48),
            "p90": 110.0,
            "model": "lgbm",
            "model_version": "v1",
            "is_fallback": False,
            "fallback_reason": None,
        }
    )
    write_forecasts(rows)
    g = GridSeries.load(["CISO", "SE"], "2021-07-01", "2021-07-10", source="files", data_dir=data_dir)
    fc = make_forecasts("auto", g, ["CISO", "SE"], start="2021-07-03", end="2021-07-06")
    assert fc.name == "warehouse"
    now = pd.Timestamp("2021-07-03T06:00Z")
    F, version, meta = fc.at(now, 60)
    np.testing.assert_allclose(F[:42, 0], 106.0 + np.arange(42))  # p50 of the 00:00 issue from 06:00 on
    naive, _, _ = NaiveForecast(g, ["CISO", "SE"]).at(now, 60)
    np.testing.assert_allclose(F[42:, 0], naive[42:, 0])  # beyond the issue's horizon: naive
    np.testing.assert_allclose(F[:, 1], naive[:, 1])  # SE not issued: naive
    assert "lgbm" in version and 0 < meta["fallback_share"] < 1


def test_evaluation_forecasts_keep_the_backtest(tmp_warehouse, data_dir):
    """A backtest (daily issues) beside forecasts of the pipeline (another version, one issued at noon): the
    evaluation's default reads the backtest alone; the hourly plan's (all versions) lets the noon issue win and names
    the version it used (forecast.forecasts keeps one version per model and issue hour); an absent version is a clear
    error; without a stored backtest (the hourly forecast DAG's stream, a version per training) every version."""
    from forecasting.store import write_forecasts
    from scheduling.planning.forecasts import BACKTEST

    def issue(at, value, version):
        at = pd.Timestamp(at)
        return pd.DataFrame(
            {
                "issued_at": at,
                "target_time": at + pd.to_timedelta(np.arange(48), unit="h"),
                "region": "CISO",
                "target": "carbon_intensity",
                "p10": value - 10,
                "p50": value,
                "p90": value + 10,
                "model": "ensemble",
                "model_version": version,
                "is_fallback": False,
                "fallback_reason": None,
            }
        )

    write_forecasts(
        pd.concat(
            [
                issue("2021-07-03T00:00Z", 100.0, "backtest-2021-07-01"),
                issue("2021-07-04T00:00Z", 100.0, "backtest-2021-07-01"),
                issue("2021-07-03T12:00Z", 300.0, "20210617T0000Z.1"),
            ],
            ignore_index=True,
        )
    )
    g = GridSeries.load(["CISO"], "2021-07-01", "2021-07-10", source="files", data_dir=data_dir)
    now = pd.Timestamp("2021-07-03T18:00Z")
    pinned = make_forecasts("warehouse", g, ["CISO"], start="2021-07-03", end="2021-07-06", version=BACKTEST)
    F, label, _ = pinned.at(now, 6)
    assert pinned.versions == ["backtest-2021-07-01"] and np.allclose(F[:, 0], 100.0)
    assert "20210617" not in label
    mixed = make_forecasts("warehouse", g, ["CISO"], start="2021-07-03", end="2021-07-06")
    F, label, _ = mixed.at(now, 6)
    assert len(mixed.versions) == 2 and np.allclose(F[:, 0], 300.0)
    assert label == "forecast.forecasts:ensemble:20210617T0000Z.1@2021-07-03T12:00:00+00:00+naive-24"  # the one used
    F, label, _ = mixed.at(pd.Timestamp("2021-07-04T06:00Z"), 6)  # the next day's backtest issue is later
    assert np.allclose(F[:, 0], 100.0) and label.startswith("forecast.forecasts:ensemble:backtest-2021-07-01@")
    exact = make_forecasts("warehouse", g, ["CISO"], start="2021-07-03", end="2021-07-06", version="20210617T0000Z.1")
    assert np.allclose(exact.at(now, 6)[0][:, 0], 300.0)
    with pytest.raises(ValueError, match="version 'v9'.*versions present"):
        make_forecasts("warehouse", g, ["CISO"], start="2021-07-03", end="2021-07-06", version="v9")
    # No backtest stored (a warehouse fed by the hourly forecast DAG, a version per training): every version.
    write_forecasts(
        pd.concat(
            [
                issue("2021-07-03T06:00Z", 200.0, "20210618T0000Z.1"),
                issue("2021-07-03T12:00Z", 250.0, "20210619T0000Z.1"),
            ]
        ).assign(model="lgbm")
    )
    stream = make_forecasts(
        "warehouse", g, ["CISO"], start="2021-07-03", end="2021-07-06", model="lgbm", version=BACKTEST
    )
    assert stream.versions == ["20210618T0000Z.1", "20210619T0000Z.1"]
    assert np.allclose(stream.at(now, 6)[0][:, 0], 250.0)


def test_plan_hour_api(data_dir):
    from scheduling.domain.fleet import load_fleet
    from scheduling.domain.jobs import SpeedModel, generate_jobs
    from scheduling.planning.session import plan_hour

    fleet = load_fleet(regions=3, data_dir=data_dir)
    t = pd.Timestamp("2021-07-05T12:00Z")
    jobs = generate_jobs(30, t - pd.Timedelta(hours=5), 6, fleet, seed=1, data_dir=data_dir)
    running = pd.DataFrame(
        {
            "job_id": ["r0"],
            "cluster": [fleet.names[0]],
            "num_gpu": [2],
            "gpu_milli": [1000],
            "cpu_milli": [4000],
            "memory_mib": [8192],
            "end_time": [t + pd.Timedelta(hours=3)],
        }
    )
    plan = plan_hour(t, jobs, fleet=fleet, forecasts="naive", running=running, data_dir=data_dir)
    assert plan.plan_time == t and plan.n_jobs == len(jobs)
    assert (plan.assignments["start_time"] >= t).all()
    assert plan.forecast_version.startswith("naive-24")
    disp = plan.dispatched()
    assert disp["node"].notna().all()
    # each assignment records the speed its run time assumed (relative to a V100 at the default limit)
    a = plan.assignments.merge(jobs[["job_id", "job_type", "duration_h_ref"]], on="job_id")
    models = [fleet.model_of(fleet.index(c)) for c in a["cluster"]]
    speed = SpeedModel(data_dir)
    np.testing.assert_allclose(a["speed"], [speed.speed(t, m) for t, m in zip(a["job_type"], models)])
    full = (a["power_limit_w"] == [m.peak_w for m in models]).to_numpy()
    planned_h = (a["end_time"] - a["start_time"]).dt.total_seconds() / 3600.0
    assert full.any()
    np.testing.assert_allclose((a["duration_h_ref"] / a["speed"])[full], planned_h[full], rtol=1e-6)


def test_cli_evaluate_json_only(capsys, data_dir, tmp_path):
    from scheduling.cli import main

    rc = main(
        [
            "evaluate",
            "--jobs",
            "30",
            "--regions",
            "3",
            "--start",
            START,
            "--days",
            "1",
            "--load",
            "0.6",
            "--forecasts",
            "naive",
            "--policies",
            "priority,greedy-carbon",
            "--load-basis",
            "device-share",
            "--json",
            "--no-progress",
            "--out",
            str(tmp_path / "ev.json"),
            "--report-md",
            str(tmp_path / "results.md"),
            "--data-dir",
            str(data_dir),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    rep = json.loads(out)
    assert rep["forecasts"]["used"] == "naive" and rep["config"]["load_basis"] == "device-share"
    assert set(rep["policies"]) == {"priority", "greedy-carbon", "performance-first"}
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# Carbon-aware planner") and "load target 0.6 on the device-share basis" in md
    assert json.loads((tmp_path / "ev.json").read_text())["config"]["n_jobs"] == rep["config"]["n_jobs"]
    assert main(["evaluate", "--from-json", str(tmp_path / "ev.json"), "--data-dir", str(data_dir)]) == 0
    assert f"load 0.6 (device-share, {rep['fleet']['total_gpus']} GPUs)" in capsys.readouterr().out


def test_scaled_fleet_deadlines_are_feasible_and_sizing_counts_slow_gpus(scenario):
    """After re-sizing, home cluster and deadline refer to the fleet the jobs run on: every job meets its deadline
    when started at submission on some cluster that can host it; the load counts the run time on the GPUs a busy
    fleet uses (slow ones too), so it is at least the fastest-GPU figure."""
    from scheduling.evaluation.scenario import demand_gpu_hours

    tbl = scenario.table
    names = scenario.fleet.names
    assert scenario.jobs["home_cluster"].isin(names).all()
    home = tbl.home
    assert (home >= 0).all() and tbl.allowed[np.arange(tbl.n), home].all()
    fastest = np.where(tbl.allowed, tbl.base_dur, np.inf).min(axis=1)
    assert (tbl.submit_h + fastest <= tbl.deadline_h + 1e-9).all()
    fleet_h = demand_gpu_hours(scenario.jobs, tbl)
    assert fleet_h >= demand_gpu_hours(scenario.jobs, tbl, on="fastest") - 1e-9
    assert scenario.config["offered_load"] == pytest.approx(
        fleet_h / (scenario.fleet.total_gpus * scenario.hours), abs=1e-3
    )


def test_jobs_bound_to_a_gpu_model_get_that_model_at_the_load(data_dir):
    """On the openb trace whose jobs name GPU models (gpuspec33), every set of clusters that some jobs can run on
    only gets the GPUs their work needs at `load`, even where the fleet's total would leave it short."""
    from scheduling.evaluation.scenario import bound_minimum_gpus

    sc = build_scenario(
        start=START, days=2, n_jobs=400, regions=6, load=0.8, seed=0, forecasts="naive", data_dir=data_dir,
        grid_source="files", tail_days=4, pod_list="gpuspec33",
    )  # fmt: skip
    tbl = sc.table
    minimum = bound_minimum_gpus(sc.jobs, tbl, 0.8, sc.hours)
    gpus = np.array([c.n_gpus for c in sc.fleet.clusters])
    assert (gpus >= np.floor(minimum)).all()
    bound = tbl.allowed.sum(axis=1) == 1
    assert bound.any()  # jobs that one cluster alone can run
    share = sc.jobs["num_gpu"].to_numpy(float) * sc.jobs["gpu_milli"].to_numpy(float) / 1000.0
    for c in np.flatnonzero(tbl.allowed[bound].any(axis=0)):
        only_here = bound & tbl.allowed[:, c]
        need = (share[only_here] * tbl.base_dur[only_here, c]).sum() / (0.8 * sc.hours)
        assert gpus[c] >= need - 1.0  # whole nodes: within a GPU of the need
    even = sc.fleet.scaled(float(gpus.sum()))  # the same total split by weight alone
    assert any(e.n_gpus < m - 1 for e, m in zip(even.clusters, minimum)), "the total alone would leave one short"


def test_calibrated_fleet_reaches_the_placed_load(data_dir):
    """`calibrate`: the fleet is re-sized until the GPU-hours performance-first runs the jobs with are about
    `load` of the fleet's GPU-hours (whole nodes, so only about); every fleet tried is measured and the kept one
    is the closest: performance-first on the returned scenario places exactly the load recorded as used."""
    sc = build_scenario(
        start=START,
        days=2,
        n_jobs=120,
        regions=6,
        load=0.5,
        seed=3,
        forecasts="naive",
        data_dir=data_dir,
        grid_source="files",
        tail_days=4,
        calibrate=2,
    )
    cal = sc.config["load_calibration"]
    assert 2 <= len(cal) <= 3 and "performance-first" in sc.config["load_definition"]
    used = [c for c in cal if c["used"]]
    assert len(used) == 1 and used[0]["gpus"] == sc.fleet.total_gpus
    assert abs(used[0]["placed_load"] - 0.5) == min(abs(c["placed_load"] - 0.5) for c in cal)
    placed = simulate(sc, "performance-first").metrics["placed_load"]
    assert placed == pytest.approx(used[0]["placed_load"], abs=1e-4)
    assert abs(placed - 0.5) < 0.12


def test_device_share_load_counts_what_shared_jobs_hold(data_dir):
    """`load_basis="device-share"`: on a trace where every GPU job shares a device (gpushare100), a job counts for
    the share of a device it holds among jobs of its size, so the fleet for the same load is larger than on the
    GPU-milli the jobs ask for, and the offered load is computed on the held shares."""
    from scheduling.evaluation.load import job_gpus
    from scheduling.evaluation.scenario import demand_gpu_hours
    from scheduling.packing.pods import held_milli

    kw = dict(start=START, days=2, n_jobs=300, regions=6, load=0.5, seed=0, forecasts="naive", data_dir=data_dir,
              grid_source="files", tail_days=4, pod_list="gpushare100")  # fmt: skip
    asked = build_scenario(**kw)
    held = build_scenario(**kw, load_basis="device-share")
    assert held.config["load_basis"] == "device-share" and asked.config["load_basis"] == "gpu-milli"
    assert held.fleet.total_gpus > asked.fleet.total_gpus
    gpus = job_gpus(held.jobs, "device-share")
    np.testing.assert_allclose(gpus, held_milli(held.jobs["gpu_milli"].to_numpy()) / 1000.0)
    assert (gpus > job_gpus(held.jobs, "gpu-milli")).mean() > 0.5
    assert held.config["offered_load"] == pytest.approx(
        demand_gpu_hours(held.jobs, held.table, basis="device-share") / (held.fleet.total_gpus * held.hours), abs=1e-3
    )
    with pytest.raises(ValueError, match="unknown load basis 'cores'"):
        job_gpus(held.jobs, "cores")


def test_replay_optimum_runs_the_bound_schedule_through_the_agents(scenario):
    """The optimum's (rounded) schedule executed hour by hour on nodes: never below the bound, most jobs start
    where and when the bound put them, and the excess carbon splits into on-plan and displaced jobs."""
    from scheduling.evaluation.bounds import replay_optimum

    out = replay_optimum(scenario, time_limit_s=120)
    assert out["optimum"]["status"] == "optimal"
    assert out["replay"]["kgco2e"] >= out["optimum_kgco2e"] - 1e-6
    assert out["replay"]["jobs_started"] == len(scenario.jobs)
    assert 0.5 <= out["on_plan_share"] <= 1.0
    total = out["excess_kg_on_plan"] + out["excess_kg_displaced"]
    assert total == pytest.approx(out["replay"]["kgco2e"] - out["optimum_kgco2e"], rel=1e-6, abs=1e-6)


def test_cli_bench_plan_reports_the_process_peak_and_checks_the_targets(capsys, data_dir, tmp_path):
    from scheduling.cli import main

    rc = main(
        [
            "bench-plan",
            "--policy",
            "rolling-lp",
            "--jobs",
            "40",
            "--also",
            "1200",
            "--hours",
            "48",
            "--regions",
            "3",
            "--repeats",
            "1",
            "--recent",
            "30",
            "--out",
            str(tmp_path),
            "--data-dir",
            str(data_dir),
        ]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    small, large = rep["results"]
    assert small["jobs"] == 40 and large["jobs"] > 1000  # a few pods are dropped (no host)
    assert 0 < small["recent_arrivals"] <= 30 and small["assigned"] + small["unplaced"] == 40  # history: not planned
    assert small["targets"] == {"latency_s": 1.0, "peak_mb": 300.0}
    assert large["targets"]["peak_mb"] is None and large["memory_target_met"] is None
    # the process peak during the plan includes the interpreter and numpy, so it is far above the traced figure
    peak = small["process_peak_rss_mb"]
    assert peak is not None and peak > small["tracemalloc_peak_mb"] and peak > 20
    assert small["memory_target_met"] == (peak <= 300.0)
    # rolling-lp's parts: HiGHS inside the LP, the LP and the explanations inside the plan
    assert (
        0 < small["lp_solve_s"] <= small["lp_s"]
        and small["lp_s"] + small["explain_s"] <= small["plan_latency_s"]["max"]
    )
    assert json.loads((tmp_path / "bench_plan_rolling-lp.json").read_text())["policy"] == "rolling-lp"


def test_gap_by_job_shape_adds_up_to_the_gap_to_the_bound(report, scenario):
    opt = report["optimum"]["kgco2e"]
    assert "_per_job_kgco2e" not in report["optimum"]
    for name in ("priority", "rolling-lp"):
        by_shape = report["gap_by_job_shape"][name]
        assert sum(g["jobs"] for g in by_shape.values()) == len(scenario.jobs)
        ours = report["policies"][name]["kgco2e"]
        assert sum(g["kgco2e"] for g in by_shape.values()) == pytest.approx(ours, rel=1e-5)
        assert sum(g["optimum_kgco2e"] for g in by_shape.values()) == pytest.approx(opt, rel=1e-5)
        assert sum(g["gap_share_pct"] for g in by_shape.values()) == pytest.approx(100.0, abs=1e-3)
        # a shape at the bound's carbon moves the share by exactly its gap over the optimum's reduction
        base = report["policies"]["performance-first"]["kgco2e"]
        share = report["policies"][name]["share_of_optimum_reduction_pct"]
        for g in by_shape.values():
            assert g["share_if_at_optimum_pct"] == pytest.approx(share + 100 * g["gap_kg"] / (base - opt), abs=1e-3)
    assert "by job GPU shape" in report_markdown([report])


def test_by_cluster_accounts_for_every_gpu(report, scenario):
    """Per cluster, the allocated share and the free GPUs by kind (whole devices, fragments, standby) make up the
    cluster; the clusters' utilisations weighted by their GPUs give the fleet's, for the policies and the bound."""
    names = scenario.fleet.names
    gpus = scenario.fleet.capacity_milli / 1000.0
    for who, m in [*report["policies"].items(), ("optimum", report["optimum"])]:
        by = m["by_cluster"]
        assert list(by) == list(names), who
        fleet_util = sum(by[c]["utilization"] * g for c, g in zip(names, gpus)) / gpus.sum()
        assert fleet_util == pytest.approx(m["utilization"], abs=1e-4), who
        for c, g in zip(names, gpus):
            row = by[c]
            assert row["gpus"] == pytest.approx(g) and row["mean_intensity_g_per_kwh"] > 0
            if who == "optimum":
                continue
            free = row["idle_gpus"] + row["fragmented_gpus"] + row["standby_idle_gpus"]
            assert row["utilization"] * g + free == pytest.approx(g, abs=1e-3), (who, c)
            assert min(row["idle_gpus"], row["fragmented_gpus"], row["standby_idle_gpus"]) >= 0
    md = report_markdown([report])
    assert "Where the GPUs went, per cluster" in md
    cleanest = min(names, key=lambda c: report["policies"]["rolling-lp"]["by_cluster"][c]["mean_intensity_g_per_kwh"])
    rows = [line for line in md.splitlines() if line.startswith(f"| {cleanest} |")]
    assert rows and md.index(rows[0]) == min(md.index(f"| {c} |", md.index("Where the GPUs went")) for c in names)


def test_cli_preemption_bound_is_below_the_bound_and_reports_shares_against_both(capsys, data_dir):
    """Checkpointing jobs that may stop and resume can only lower the bound; every policy's share is reported
    against both bounds (performance-first: 0 by definition)."""
    from scheduling.cli import main

    rc = main(
        [
            "preemption-bound",
            "--jobs",
            "40",
            "--regions",
            "3",
            "--start",
            START,
            "--days",
            "1",
            "--load",
            "0.6",
            "--policies",
            "priority",
            "--time-limit",
            "120",
            "--data-dir",
            str(data_dir),
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    full, pre = out["optimum"], out["optimum_preemptive"]
    assert full["lp"]["status"] == pre["lp"]["status"] == "optimal"
    assert 0 < pre["preemptible_share"] <= 1
    assert pre["kgco2e"] <= full["kgco2e"] + 1e-6
    assert out["preemption_saves_at_most_kg"] == pytest.approx(full["kgco2e"] - pre["kgco2e"])
    assert set(out["policies"]) == {"performance-first", "priority"}
    pf = out["policies"]["performance-first"]
    assert pf["share_of_optimum_reduction_pct"] == pf["share_of_optimum_preemptive_reduction_pct"] == 0.0


def test_a_preempted_job_resumes_with_the_work_left_and_both_runs_are_charged(scenario):
    """HourlyPlanner.preempt keeps the work done by the checkpoint signal (the job's checkpoint time before the
    stop), makes the job pending again with run times of the restore plus the work left; execute charges the run
    before the preemption and the one after (and the data moved between two clusters) from the actual intensity."""
    from scheduling.domain.execution import DEFAULT_CHECKPOINT_MIN
    from scheduling.evaluation.simulator import execute
    from scheduling.planning.pausing import Pausing
    from scheduling.planning.policies.rolling_lp import RollingLP
    from scheduling.planning.session import HourlyPlanner

    sc = scenario
    tbl = sc.table
    hp = HourlyPlanner(
        sc.fleet,
        table=tbl,
        policy=RollingLP(),
        forecasts=sc.forecasts,
        workload=sc.workload,
        explain=False,
        pausing=Pausing(for_deadline=True),
    )
    ck = tbl.jobs["checkpointing"].to_numpy(bool)
    fits = [
        i
        for i in range(tbl.n)
        if ck[i]
        and (tbl.allowed[i] & np.isfinite(tbl.dur[i, 0])).sum() >= 2
        and np.nanmin(np.where(tbl.allowed[i], tbl.dur[i, 0], np.inf)) > 4
    ]
    j = int(max(fits, key=lambda i: tbl.jobs["flexibility"].iat[i]))  # the most slack: evictable after 2 hours
    c1, c2 = (int(c) for c in np.flatnonzero(tbl.allowed[j] & np.isfinite(tbl.dur[j, 0]))[:2])
    T = int(tbl.submit_h[j])
    hp.started[j], hp.start_h[j], hp.first_start_h[j], hp.k[j], hp.c[j] = True, T, T, 0, c1
    hp.end_occ_h[j] = T + int(np.ceil(tbl.dur[j, 0, c1]))
    assert str(tbl.jobs["job_id"].iat[j]) in hp.evictable(pd.Timestamp((T + 2) * 3_600_000_000_000, tz="UTC"), T + 2)
    hp.preempt(j, T + 2)
    ck_h = DEFAULT_CHECKPOINT_MIN / 60.0  # the trace sets no checkpoint_overhead_min: save and restore take 5 min
    done = (2 - ck_h) / tbl.dur[j, 0, c1]
    assert hp.work_done[j] == pytest.approx(done) and hp.preemptions[j] == 1
    assert j not in hp.pending(T + 2) and j in hp.pending(T + 3)  # queued again from the next hour, as in the loop
    prob = tbl.problem(
        sc.start, [j], np.zeros((24, len(sc.fleet)), np.int64), np.zeros((24, len(sc.fleet))), work_left=[1 - done]
    )
    assert prob.dur[0, 0, c2] == pytest.approx(ck_h + tbl.dur[j, 0, c2] * (1 - done))
    start = np.full(tbl.n, -1)
    start[j] = T + 5
    k = np.zeros(tbl.n, np.int64)
    c = np.zeros(tbl.n, np.int64)
    c[j] = c2
    d2 = ck_h + tbl.dur[j, 0, c2] * (1 - done)
    run_h = np.zeros(tbl.n)
    run_h[j] = d2
    ex = execute(sc, start, k, c, run_h, hp.preempted_runs)
    t0, ci = sc.actual("ci")
    whole = int(np.floor(d2))
    s2 = T + 5 - t0
    home = tbl.home[j]
    first = tbl.kw[j, 0, c1] * ci[T - t0 : T - t0 + 2, c1].sum() + tbl.transfer_kwh[j, c1] * 0.5 * (
        ci[T - t0, home] + ci[T - t0, c1]
    )
    second = tbl.kw[j, 0, c2] * (ci[s2 : s2 + whole, c2].sum() + (d2 - whole) * ci[s2 + whole, c2]) + tbl.transfer_kwh[
        j, c2
    ] * 0.5 * (ci[s2, c1] + ci[s2, c2])
    assert ex["kg"][j] == pytest.approx((first + second) / 1000.0, rel=1e-9)
    assert ex["dur_h"][j] == pytest.approx(2 + d2) and ex["kg"].sum() == pytest.approx(ex["kg"][j])


def test_cli_evaluate_over_seeds_reports_each_run_and_the_mean_and_range(capsys, data_dir, tmp_path):
    """Two trace seeds: one JSON per seed, the over-seeds rows (mean within min..max, the bound's share 100 %) in the
    JSON and the markdown; rebuilding from the two saved files gives the same rows."""
    from scheduling.cli import main

    common = ["--json", "--no-progress", "--data-dir", str(data_dir)]
    rc = main(
        [
            "evaluate",
            "--jobs",
            "30",
            "--regions",
            "3",
            "--start",
            START,
            "--days",
            "1",
            "--load",
            "0.6",
            "--forecasts",
            "naive",
            "--policies",
            "priority",
            "--seed",
            "3",
            "4",
            "--out",
            str(tmp_path / "ev.json"),
            "--report-md",
            str(tmp_path / "results.md"),
            *common,
        ]
    )
    assert rc == 0
    payload = json.loads(capsys.readouterr().out)
    assert [r["config"]["seed"] for r in payload["runs"]] == [3, 4]
    rows = {r["policy"]: r for r in payload["over_seeds"]}
    assert set(rows) == {"priority", "performance-first", "optimum"}
    for r in rows.values():
        assert r["seeds"] == [3, 4]
        assert r["share_min_pct"] <= r["share_mean_pct"] <= r["share_max_pct"]
        assert r["deadlines_min"] <= r["deadlines_mean"] <= 1
    assert rows["optimum"]["share_mean_pct"] == 100.0 and rows["performance-first"]["share_mean_pct"] == 0.0
    shares = [run["policies"]["priority"]["share_of_optimum_reduction_pct"] for run in payload["runs"]]
    assert rows["priority"]["share_mean_pct"] == pytest.approx(np.mean(shares))
    md = (tmp_path / "results.md").read_text()
    assert "## Over trace seeds" in md and "trace seed 4" in md
    files = sorted(tmp_path.glob("ev_*_seed*.json"))
    assert [f.name[-10:] for f in files] == ["seed3.json", "seed4.json"]
    rc = main(["evaluate", "--from-json", *map(str, files), "--report-md", str(tmp_path / "again.md"), *common])
    assert rc == 0
    again = json.loads(capsys.readouterr().out)
    assert again["over_seeds"] == payload["over_seeds"]


def test_a_bound_the_solver_did_not_finish_is_reported_missing_not_zero(scenario):
    """HiGHS stopped by its time limit returns no solution; read as a bound that would be 0 kg and every policy's
    share measured against zero emissions (a 9000-job LP on a busy host did exactly that). solve_optimum raises,
    evaluate keeps the policies' results and reports the bound as missing, with the reason, and no shares."""
    from scheduling.evaluation.bounds import BoundNotSolved, solve_optimum

    with pytest.raises(BoundNotSolved, match="time limit"):
        solve_optimum(scenario, time_limit_s=0.0)
    rep = evaluate(scenario, ["performance-first"], with_optimum=True, lp_time_limit_s=0.0)
    assert rep["optimum"] is None and "iteration_or_time_limit" in rep["optimum_error"]
    assert rep["policies"]["performance-first"]["kgco2e"] > 0
    assert all(m["share_of_optimum_reduction_pct"] is None for m in rep["policies"].values())
    assert "No bound for this run" in report_markdown([rep])
    assert solve_optimum(scenario)["kgco2e"] > 0  # with time, the same LP solves


def test_ablations_include_the_perfect_information_reference(scenario):
    rep = evaluate(scenario, ["performance-first", "rolling-lp"], ablations=True)
    abl = rep["ablations"]
    assert set(abl) == {
        "priority-noprices",
        "priority-oracle-forecast",
        "priority-naive-forecast",
        "rolling-lp-oracle-forecast",
        "rolling-lp-naive-forecast",
        "rolling-lp-perfect-information",
    }
    for m in abl.values():
        assert m["jobs_started"] + m["jobs_never_started"] == len(scenario.jobs)
        assert m["share_of_optimum_reduction_pct"] is not None
    # the reference differs from oracle forecasts alone by the arrivals it sees; both charge the actual intensity
    perfect, oracle = abl["rolling-lp-perfect-information"], abl["rolling-lp-oracle-forecast"]
    assert perfect["forecast_fallback_share"] == oracle["forecast_fallback_share"] == 0
    assert "rolling-lp-perfect-information" in report_markdown([rep])


def test_over_seeds_reports_the_perfect_information_reference_beside_the_policies():
    from scheduling.evaluation.ablations import PERFECT_INFORMATION
    from scheduling.evaluation.results import over_seeds

    def report(seed, rolling, perfect):
        def m(share):
            return {"share_of_optimum_reduction_pct": share, "deadline_satisfaction": 0.99, "kgco2e": 100 - share}

        return {
            "config": {"start": "2021-07-01", "load_target": 0.5, "seed": seed, "n_jobs_requested": 3000, "days": 14},
            "policies": {"performance-first": m(0.0), "rolling-lp": m(rolling)},
            "ablations": {
                "rolling-lp-oracle-forecast": m(rolling + 1),
                **({PERFECT_INFORMATION: m(perfect)} if perfect is not None else {}),
            },
        }

    rows = {r["policy"]: r for r in over_seeds([report(0, 70.0, 74.0), report(1, 72.0, 80.0)])}
    assert set(rows) == {"performance-first", "rolling-lp", PERFECT_INFORMATION}  # other ablations stay out
    ref = rows[PERFECT_INFORMATION]
    assert (ref["runs"], ref["share_mean_pct"], ref["share_min_pct"], ref["share_max_pct"]) == (2, 77.0, 74.0, 80.0)
    # a reference that ran on one seed only: over every seed it is left out, over the seeds it ran on it is shown
    reps = [report(0, 70.0, 74.0), report(1, 72.0, None)]
    assert PERFECT_INFORMATION not in {r["policy"] for r in over_seeds(reps)}
    partial = {r["policy"]: r for r in over_seeds(reps, partial=True)}
    assert partial[PERFECT_INFORMATION]["runs"] == 1 and partial["rolling-lp"]["runs"] == 2


def test_run_now_starts_every_job_at_submission_on_its_home_cluster(scenario):
    """The run-now counterfactual by hand for every job: home cluster, default option, from the submission hour,
    energy x the actual intensity hour by hour (the last hour pro rata); nothing is moved, so no transfer."""
    out = run_now(scenario)
    tbl = scenario.table
    t0, ci = scenario.actual("ci")
    assert (tbl.home >= 0).all() and tbl.allowed[np.arange(tbl.n), tbl.home].all()
    for j in range(tbl.n):
        c, dur = tbl.home[j], tbl.dur[j, 0, tbl.home[j]]
        hours = np.arange(tbl.submit_h[j], tbl.submit_h[j] + int(np.ceil(dur))) - t0
        weights = np.minimum(1.0, dur - np.arange(len(hours)))
        kg = tbl.kw[j, 0, c] * (ci[hours, c] * weights).sum() / 1000.0
        assert out["dur_h"][j] == pytest.approx(dur)
        assert out["kg"][j] == pytest.approx(kg, rel=1e-9)
    # the carbon-aware plan of the same jobs emits less than running them at once
    planned = simulate(scenario, "rolling-lp")
    assert planned.metrics["kgco2e"] < out["kg"].sum()
    # its deadline regret: the late jobs that run-now keeps on time (run-now ends at submission + its run time)
    kept_now = tbl.submit_h + out["dur_h"] <= tbl.deadline_h + 1e-6
    late = ~planned.records["met_deadline"].to_numpy(bool)
    assert planned.metrics["deadline_regret"] == pytest.approx((late & kept_now).sum() / tbl.n)


def test_the_simulator_pauses_a_run_with_the_loops_rule_and_resumes_it_with_the_work_kept(scenario):
    """HourlyPlanner.pause_running runs `pausing.pause_running` on the simulator's state: a running checkpointing
    job it pauses leaves its node at once, keeps the work done by the checkpoint signal (2 h in, minus the 5-minute
    save) and is pending again from the next hour, resuming for the restore plus the rest (`execution.run_wall_h`)."""
    from scheduling.domain.execution import DEFAULT_CHECKPOINT_MIN
    from scheduling.planning.pausing import Pausing
    from scheduling.planning.session import HourlyPlanner

    sc = scenario
    tbl = sc.table
    # min_saving -100: pause whatever the forecast says, wherever the deadline allows it
    hp = HourlyPlanner(
        sc.fleet, table=tbl, policy="rolling-lp", forecasts=sc.forecasts, workload=sc.workload, explain=False,
        pausing=Pausing(for_carbon=True, min_saving=-100.0, for_deadline=True),
    )  # fmt: skip
    ck = tbl.jobs["checkpointing"].to_numpy(bool)
    slack = (tbl.deadline_h + tbl.deadline_spare - tbl.submit_h) - np.nanmin(
        np.where(tbl.allowed, tbl.dur[:, 0], np.inf), 1
    )
    j = int(np.argmax(np.where(ck & (np.nanmin(np.where(tbl.allowed, tbl.dur[:, 0], np.inf), 1) > 4), slack, -np.inf)))
    c = int(np.flatnonzero(tbl.allowed[j] & np.isfinite(tbl.dur[j, 0]))[0])
    T = int(tbl.submit_h[j])
    pod = hp.pods[j]
    placed = hp.agents[c].offer(pod, T + int(np.ceil(tbl.dur[j, 0, c])))
    assert placed is not None
    hp.started[j], hp.start_h[j], hp.first_start_h[j], hp.k[j], hp.c[j] = True, T, T, 0, c
    hp.end_occ_h[j] = T + int(np.ceil(tbl.dur[j, 0, c]))
    used = hp.agents[c].gpu_milli_allocated
    now = pd.Timestamp((T + 2) * 3_600_000_000_000, tz="UTC")
    assert str(tbl.jobs["job_id"].iat[j]) in hp.evictable(now, T + 2)  # the loop's rule offers it to a due job
    assert hp.pause_running(now, T + 2) == [j]
    ck_h = DEFAULT_CHECKPOINT_MIN / 60.0
    assert hp.work_done[j] == pytest.approx((2 - ck_h) / tbl.dur[j, 0, c])
    assert hp.agents[c].gpu_milli_allocated == used - tbl.gpu_total[j]
    assert j not in hp.pending(T + 2) and j in hp.pending(T + 3)  # the stop is the loop's: queued the next hour
    assert hp.paused == [(j, T + 2)] and hp.preempted_runs == [(j, T, 2, 0, c)]
    hp.k[j], hp.c[j] = 0, c  # resumed where it ran: the restore, then the rest
    assert hp.run_hours(j) == pytest.approx(ck_h + tbl.dur[j, 0, c] * (1 - hp.work_done[j]))


def test_held_capacity_keeps_jobs_off_those_gpus_for_its_hours(scenario):
    """Capacity held outside the jobs (the loop's service replicas, `held`) is applied at its start hour like the
    loop's running rows: with every GPU of the fleet held for the first 6 hours, no job starts before hour 6; a job
    starts earlier without it."""
    import pandas as pd

    start = pd.Timestamp(scenario.start).tz_convert("UTC")
    rows = [
        {"job_id": f"held:{c.name}:{n.sn}", "cluster": c.name, "node": str(n.sn), "num_gpu": int(n.gpu),
         "gpu_milli": 1000, "start_time": start, "end_time": start + pd.Timedelta(hours=6)}
        for c in scenario.fleet.clusters
        for n in c.nodes.itertuples(index=False)
    ]  # fmt: skip
    free = simulate(scenario, "performance-first").records
    held = simulate(scenario, "performance-first", held=pd.DataFrame(rows)).records
    first = lambda r: pd.to_datetime(r.loc[r["started"], "start_time"], utc=True).min()  # noqa: E731
    assert first(free) < start + pd.Timedelta(hours=6) <= first(held)
