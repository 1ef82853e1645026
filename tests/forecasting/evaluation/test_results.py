"""The results document of the standard comparison: every bucket, the published baselines, the losses."""

from __future__ import annotations

from forecasting.evaluation import results


def test_results_table_renders_every_bucket_and_the_baselines(grid_dir, tmp_path, monkeypatch):
    calls = []

    def fake_job(spec):
        calls.append(spec)
        regions = results.target_regions(spec["target"], spec["regions"])
        by = {
            b: {"mape": 5.0, "error_pct_of_mean": 12.0, "coverage_p10_p90": 80.0}
            for b in ("1-6", "7-24", "25-48", "49-96")
        }
        metrics = {
            "mape": 5.0,
            "day_ahead_mape": 5.0,
            "error_pct_of_mean": 12.0,
            "day_ahead_error_pct_of_mean": 12.0,
            "coverage_p10_p90": 80.0,
            "day_ahead_coverage_p10_p90": 80.0,
            "by_horizon": by,
        }
        return {
            "target": spec["target"],
            "model": spec["model"],
            "fit_cpu_s": 1.0,
            "fit_wall_s": 1.0,
            "predict_cpu_s": 1.0,
            "predict_wall_s": 1.0,
            "regions": {r: metrics for r in regions},
        }

    monkeypatch.setattr(results, "results_job", fake_job)
    res = results.build_results(
        ["naive-24", "ensemble"],
        ["carbon_intensity", "wind"],
        ["DE", "SE", "PJM"],
        "2021-07-01",
        "2021-12-31",
        source="files",
    )
    text = results.render_markdown(res, "python -m forecasting results")
    assert len(calls) == 4
    assert "| DE | published: DACF |" in text and "49-96" in text
    assert "**5.00**" in text  # 5 % beats DACF's DE 9.08
    assert "DACF ANN" in text  # PJM wind is not an operator forecast
    assert "wind SE: ensemble 12.00 vs ENTSO-E" in text  # a loss is listed
