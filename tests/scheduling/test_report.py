"""The evaluation report renders: index.html exists, every PNG it references exists and is a PNG, cards are
capped (and the page says so), and the simulator adapter produces the same from a small real scenario."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scheduling.evaluation.report import run_evaluation, validate_evaluation_params, write_report
from tests.scheduling.test_plan_store import sample_plan


def _check_page(index: Path) -> list[str]:
    assert index.exists()
    page = index.read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert images
    for rel in images:
        data = (index.parent / rel).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", rel
    return images


def _evaluation(n_jobs: int = 8) -> dict:
    plan = sample_plan(n_jobs=n_jobs)
    hours = pd.date_range("2021-07-15T00:00Z", periods=72, freq="h")
    forecast = pd.concat(
        [
            pd.DataFrame(
                {
                    "region": region,
                    "target_time": hours,
                    "p50": 200 + 50 * np.sin(np.arange(72) / 4 + k),
                    "p10": 160 + 50 * np.sin(np.arange(72) / 4 + k),
                    "p90": 250 + 50 * np.sin(np.arange(72) / 4 + k),
                }
            )
            for k, region in enumerate(["us-west", "eu-north", "us-east", "eu-central", "us-south"])
        ]
    )
    return {
        "meta": {"period_start": "2021-07-15", "days": 1, "note": "<script>escaped</script>"},
        "policies": [
            {"policy": "priority", "kgco2e": 100.0, "deadline_met_share": 0.99, "unallocated_gpus": 3.0},
            {"policy": "greedy-carbon", "kgco2e": 96.0, "deadline_met_share": 0.9, "unallocated_gpus": 4.0},
            {"policy": "performance-first", "kgco2e": 140.0, "deadline_met_share": 1.0, "unallocated_gpus": 2.0},
        ],
        "optimum_kgco2e": 90.0,
        "by_region": pd.DataFrame(
            {
                "policy": ["priority", "performance-first"] * 2,
                "region": ["us-west", "us-west", "eu-north", "eu-north"],
                "kgco2e": [40.0, 60.0, 60.0, 80.0],
            }
        ),
        "timeline": plan.assignments,
        "timeline_policy": "priority",
        "forecast": forecast,
        "explanations": plan.explanations,
    }


def test_report_renders_with_charts_and_capped_cards(tmp_path):
    result = write_report(_evaluation(8), out_dir=tmp_path / "run", run_id="unit", max_cards=3)
    images = _check_page(result.index)
    for chart in (
        "carbon_per_policy",
        "deadline_satisfaction",
        "unallocated_gpus",
        "plan_timeline",
        "savings_per_region",
    ):
        assert f"charts/{chart}.png" in images
    assert len([i for i in images if i.startswith("cards/")]) == 3
    page = result.index.read_text()
    assert "3 of 8 jobs" in page and "capped at 3: 5 more jobs" in page
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert "Job job-00000: priority" in page  # the card text (template explainer)
    data = json.loads((tmp_path / "run" / "data.json").read_text())
    assert data["cards"] == {"cap": 3, "left_out": 5, "shown": 3} and data["baseline"] == "performance-first"
    savings = {(r["region"]): r for r in data["savings_per_region"]}
    assert savings["us-west"]["priority"] == pytest.approx(20.0)


def test_report_without_optional_parts(tmp_path):
    result = write_report({"policies": [{"policy": "priority", "kgco2e": 1.0}]}, out_dir=tmp_path, run_id="bare")
    _check_page(result.index)
    assert "the optimum was not computed" in result.index.read_text()
    with pytest.raises(ValueError, match="policies"):
        write_report({"policies": []}, out_dir=tmp_path)


def test_default_location_is_var_reports_evaluate(tmp_path, monkeypatch):
    monkeypatch.setenv("VAR_DIR", str(tmp_path / "var"))
    result = write_report({"policies": [{"policy": "priority", "kgco2e": 1.0}]}, run_id="manual__2021-07-15T12:00")
    assert result.index == tmp_path / "var" / "reports" / "evaluate" / "manual__2021-07-15T12_00" / "index.html"


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"policies": ["warp"]}, "warp"),
        ({"policies": ["optimum"]}, "online policy"),
        ({"period_start": "July"}, "'July'"),
        ({"days": 40}, "days 40"),
        ({"load": 0.7}, "load 0.7"),
        ({"regions": ["atlantis"]}, "atlantis"),
        ({"regions": 0}, "regions 0"),
        ({"jobs": 0}, "jobs 0"),
    ],
)
def test_evaluation_params_are_checked(change, needle):
    params = {
        "policies": ["priority", "optimum"],
        "period_start": "2021-07-01",
        "days": 2,
        "jobs": 50,
        "regions": 3,
        "load": 0.5,
        "max_cards": 10,
    }
    assert validate_evaluation_params(params)["regions"] == 3
    with pytest.raises(ValueError) as err:
        validate_evaluation_params({**params, **change})
    assert needle in str(err.value)


def test_run_evaluation_on_a_small_scenario(tmp_path, data_dir, tmp_warehouse):
    out = run_evaluation(
        start="2021-07-01",
        days=1,
        n_jobs=12,
        regions=2,
        load=0.5,
        policies=["priority", "performance-first", "optimum"],
        out_dir=tmp_path / "ev",
        max_cards=2,
        lp_time_limit_s=60,
    )
    assert set(out["metrics"]) == {"priority", "performance-first"}
    assert out["optimum_kgco2e"] is not None
    assert out["optimum_kgco2e"] <= min(m["kgco2e"] for m in out["metrics"].values()) + 1e-6
    images = _check_page(Path(out["index"]))
    assert len([i for i in images if i.startswith("cards/")]) == out["cards"] == 2
    data = json.loads((tmp_path / "ev" / "data.json").read_text())
    assert data["explanations"] and all("chosen" in e for e in data["explanations"])


def test_chart_over_runs_draws_the_mean_and_range_over_seeds(tmp_path):
    from scheduling.evaluation.report import chart_over_runs

    def report(seed, start, load, rolling_share, rolling_deadlines):
        first = {"share_of_optimum_reduction_pct": 0.0, "deadline_satisfaction": 0.9, "kgco2e": 100.0}
        return {
            "config": {"start": start, "load_target": load, "seed": seed, "n_jobs_requested": 3000, "days": 14},
            "policies": {
                "performance-first": first,
                "rolling-lp": {
                    "share_of_optimum_reduction_pct": rolling_share,
                    "deadline_satisfaction": rolling_deadlines,
                    "kgco2e": 80.0,
                },
            },
        }

    july, december = "2021-07-01T00:00:00+00:00", "2021-12-01T00:00:00+00:00"
    reports = [report(0, july, 0.5, 60.0, 0.99), report(1, july, 0.5, 70.0, 0.97), report(0, december, 0.8, 80.0, 1.0)]
    reports[2]["policies"]["random"] = {
        "share_of_optimum_reduction_pct": -20.0,
        "deadline_satisfaction": 0.4,
        "kgco2e": 120.0,
    }
    reports[0]["ablations"] = {
        "rolling-lp-perfect-information": {
            "share_of_optimum_reduction_pct": 75.0,
            "deadline_satisfaction": 1.0,
            "kgco2e": 70.0,
        }
    }
    path = tmp_path / "summary.png"
    table = chart_over_runs(reports, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    row = table[(table["period"] == "2021-07") & (table["policy"] == "rolling-lp")].iloc[0]
    assert (row["runs"], row["share_mean"], row["share_min"], row["share_max"]) == (2, 65.0, 60.0, 70.0)
    assert row["deadlines_min"] == pytest.approx(97.0) and row["deadlines_mean"] == pytest.approx(98.0)
    # our policy first, then the baselines in the order of the results tables
    assert table[table["period"] == "2021-12"]["policy"].tolist() == ["rolling-lp", "performance-first", "random"]
    assert "rolling-lp-perfect-information" not in set(table["policy"])  # a reference, not a policy: no bar
    with pytest.raises(ValueError, match="no evaluate reports"):
        chart_over_runs([], tmp_path / "none.png")
