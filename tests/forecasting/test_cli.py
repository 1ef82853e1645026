"""The command line (`python -m forecasting`): one JSON document on stdout with --json, every sub-command."""

from __future__ import annotations

import json

import pytest

from forecasting import cli


@pytest.fixture
def warehouse(tmp_warehouse, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return tmp_warehouse


def test_cli_backtest_prints_one_json_document(grid_dir, tmp_path, capsys):
    rc = cli.main(
        [
            "backtest",
            "--region",
            "CISO",
            "--target",
            "carbon_intensity",
            "--model",
            "naive-24",
            "--start",
            "2021-07-01",
            "--end",
            "2021-07-10",
            "--horizon",
            "24",
            "--json",
            "--source",
            "files",
            "--plot-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # stdout holds exactly one JSON document
    assert {"mape", "coverage_p10_p90", "by_horizon", "baseline_dacf_mape"} <= set(doc)
    assert doc["baseline_dacf_mape"] > 0
    assert (tmp_path / "carbon_intensity_naive-24_CISO.png").stat().st_size > 10_000

    rc = cli.main(
        [
            "backtest",
            "--region",
            "SE",
            "--target",
            "wind",
            "--model",
            "naive-24",
            "--start",
            "2021-07-01",
            "--end",
            "2021-07-05",
            "--json",
            "--source",
            "files",
            "--no-plot",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert {"error_pct_of_mean", "baseline_operator_error_pct_of_mean"} <= set(doc)


def test_cli_train_and_predict_print_json_only(warehouse, capfd, data_dir, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(data_dir))
    parser = cli.build_parser()

    args = parser.parse_args(
        [
            "train",
            "--models",
            "naive-24",
            "--regions",
            "SE",
            "--train-end",
            "2021-06-30",
            "--val-days",
            "3",
            "--tiny",
            "--source",
            "files",
            "--json",
        ]
    )
    assert args.func(args) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["cutoff"] == "2021-07-01T00:00:00+00:00"
    assert [(r["model"], r["status"]) for r in out["results"]] == [("naive-24", "good")]

    args = parser.parse_args(
        ["predict", "--as-of", "2021-07-15T12:00Z", "--horizon", "24", "--regions", "SE", "--source", "files", "--json"]
    )
    assert args.func(args) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["as_of"] == "2021-07-15T12:00:00+00:00" and out["rows"] == 24 and out["fallback_rows"] == 0
    assert out["forecasts"][0]["model"] == "naive-24"
