"""Gavel throughput loaders: simulation/physical CSVs and the oracle JSON."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from warehouse.loaders.base import LoadError
from warehouse.loaders.interference import gavel, parse_job_key, parse_oracle, split_job_type


@pytest.fixture(scope="module")
def tables(data_dir) -> dict[str, pd.DataFrame]:
    out: dict[str, list[pd.DataFrame]] = {}
    for batch in gavel.batches(data_dir):
        assert batch.rejections == [], batch.rejections[:3]
        assert batch.batch_id.startswith("gavel:interference/gavel/")
        out.setdefault(batch.table, []).append(batch.frame)
    return {t: pd.concat(f, ignore_index=True) for t, f in out.items()}


def test_counts_per_measurement_set(tables):
    iso, pairs = tables["raw.gavel_isolated"], tables["raw.gavel_colocated"]
    assert iso.groupby("measurement_set").size().to_dict() == {"oracle": 78, "physical": 492, "simulation": 492}
    assert pairs.groupby("measurement_set").size().to_dict() == {
        "oracle": 2_028,
        "physical": 10_338,
        "simulation": 10_338,
    }
    assert (pairs["measurement_set"] == "simulation").sum() >= 10_000
    assert list(iso.columns) == [
        "measurement_set",
        "gpu_type",
        "consolidated",
        "job_type",
        "model_family",
        "batch_size",
        "scale_factor",
        "steps_per_s",
    ]
    assert list(pairs.columns) == [
        "measurement_set",
        "gpu_type",
        "consolidated",
        "job_a",
        "scale_factor_a",
        "job_b",
        "scale_factor_b",
        "steps_per_s_a_colocated",
        "steps_per_s_b_colocated",
        "steps_per_s_a_isolated",
        "steps_per_s_b_isolated",
        "norm_throughput_a",
        "norm_throughput_b",
        "feasible",
    ]


def test_simulation_facts_from_source_md(tables):
    pairs = tables["raw.gavel_colocated"]
    sim = pairs[
        (pairs["measurement_set"] == "simulation")
        & pairs["consolidated"]
        & (pairs["scale_factor_a"] == 1)
        & (pairs["scale_factor_b"] == 1)
    ]
    assert sim[sim["feasible"]].groupby("gpu_type").size().to_dict() == {"k80": 589, "p100": 656, "v100": 636}
    # every pair with a multi-GPU job is infeasible
    multi = pairs[(pairs["scale_factor_a"] > 1) | (pairs["scale_factor_b"] > 1)]
    assert not multi["feasible"].any()


def test_oracle_rows(tables, data_dir):
    iso, pairs = tables["raw.gavel_isolated"], tables["raw.gavel_colocated"]
    oracle_iso = iso[iso["measurement_set"] == "oracle"]
    assert oracle_iso.groupby("gpu_type").size().to_dict() == {"k80": 26, "p100": 26, "v100": 26}
    assert oracle_iso["consolidated"].all() and (oracle_iso["scale_factor"] == 1).all()
    raw = json.loads((data_dir / "interference/gavel/oracle_throughputs.json").read_text())
    row = oracle_iso[(oracle_iso["gpu_type"] == "p100") & (oracle_iso["job_type"] == "ResNet-50 (batch size 16)")]
    assert row["steps_per_s"].iloc[0] == raw["p100"]["ResNet-50 (batch size 16)"]["null"]
    assert (row["model_family"].iloc[0], row["batch_size"].iloc[0]) == ("ResNet-50", 16)
    oracle_pairs = pairs[pairs["measurement_set"] == "oracle"]
    pair = oracle_pairs[
        (oracle_pairs["gpu_type"] == "p100")
        & (oracle_pairs["job_a"] == "ResNet-50 (batch size 16)")
        & (oracle_pairs["job_b"] == "ResNet-50 (batch size 32)")
    ].iloc[0]
    a, b = raw["p100"]["ResNet-50 (batch size 16)"]["ResNet-50 (batch size 32)"]
    assert (pair["steps_per_s_a_colocated"], pair["steps_per_s_b_colocated"]) == (a, b)
    assert pair["steps_per_s_b_isolated"] == raw["p100"]["ResNet-50 (batch size 32)"]["null"]
    assert pair["norm_throughput_a"] == pytest.approx(a / raw["p100"]["ResNet-50 (batch size 16)"]["null"])
    zero = oracle_pairs[(oracle_pairs["steps_per_s_a_colocated"] == 0) & (oracle_pairs["steps_per_s_b_colocated"] == 0)]
    assert len(zero) > 0 and not zero["feasible"].any()
    assert oracle_pairs["feasible"].sum() == len(oracle_pairs) - len(zero)


def test_job_keys():
    assert parse_job_key("('ResNet-18 (batch size 64)', 1)") == ("ResNet-18 (batch size 64)", 1)
    assert parse_job_key("('LM (batch size 20)', 4)") == ("LM (batch size 20)", 4)
    assert parse_job_key("A3C") == ("A3C", 1)
    for bad in ("('x', 0)", "('x',)", "(1, 2)", "(oops", ""):
        with pytest.raises(ValueError):
            parse_job_key(bad)
    assert split_job_type("Recommendation (batch size 8192)") == ("Recommendation", 8192)
    assert split_job_type("CycleGAN") == ("CycleGAN", None)


def test_oracle_tuple_keys_and_bad_entries(tmp_path):
    data = {
        "v100": {
            "('A (batch size 8)', 1)": {
                "null": 10.0,
                "('A (batch size 8)', 1)": [4.0, 4.0],
                "('B', 2)": [0.0, 0.0],
                "('C', 1)": [1.0, 2.0],  # partner without isolated entry
                "('B', 2) extra": [1.0, 2.0],  # unparsable key
            },
            "('B', 2)": {"null": 0.0, "('A (batch size 8)', 1)": [0.0, 0.0]},
            "('D', 1)": {"null": -1.0},
            "('E', 1)": {"null": 3.0, "('A (batch size 8)', 1)": [1.0, "fast"]},
        },
        "k80_unconsolidated": {"F": {"null": 2.0, "F": [1.0, 1.0]}},
    }
    path = tmp_path / "oracle_throughputs.json"
    path.write_text(json.dumps(data))
    iso, pairs, iso_rej, pair_rej = parse_oracle(path)
    assert iso[["gpu_type", "consolidated", "job_type", "scale_factor", "steps_per_s"]].values.tolist() == [
        ["v100", True, "A (batch size 8)", 1, 10.0],
        ["v100", True, "B", 2, 0.0],
        ["v100", True, "E", 1, 3.0],
        ["k80", False, "F", 1, 2.0],
    ]
    assert iso["batch_size"].tolist() == [8, pd.NA, pd.NA, pd.NA]
    got = pairs[["job_a", "job_b", "norm_throughput_a", "norm_throughput_b", "feasible"]].values.tolist()
    assert got == [
        ["A (batch size 8)", "A (batch size 8)", 0.4, 0.4, True],
        ["A (batch size 8)", "B", 0.0, pd.NA, False],
        ["B", "A (batch size 8)", pd.NA, 0.0, False],
        ["F", "F", 0.5, 0.5, True],
    ]
    assert [(r.field, r.reason) for r in iso_rej] == [
        ("v100/('D', 1)/null", "isolated throughput missing, negative or not a number")
    ]
    assert sorted((r.field, r.reason.split(" ")[0]) for r in pair_rej) == [
        ("v100/('A (batch size 8)', 1)/('B', 2) extra", "job"),
        ("v100/('A (batch size 8)', 1)/('C', 1)", "partner"),
        ("v100/('E', 1)/('A (batch size 8)', 1)", "co-located"),
    ]
    assert all(r.file == str(path) for r in iso_rej + pair_rej)


def test_oracle_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "oracle_throughputs.json"
    path.write_text('{\n  "k80": {\n    "A": {"null": 1.0,,}\n  }\n}\n')
    with pytest.raises(LoadError, match=r"oracle_throughputs\.json, row 3: malformed JSON"):
        parse_oracle(path)
    path.write_text("[1, 2]")
    with pytest.raises(LoadError, match="expected a JSON object"):
        parse_oracle(path)


def test_colocated_rows_are_checked(tmp_path):
    folder = tmp_path / "interference" / "gavel"
    folder.mkdir(parents=True)
    header = (
        "gpu_type,consolidated,job_a,scale_factor_a,job_b,scale_factor_b,steps_per_sec_a_colocated,"
        "steps_per_sec_b_colocated,steps_per_sec_a_isolated,steps_per_sec_b_isolated,norm_throughput_a,"
        "norm_throughput_b,feasible\n"
    )
    (folder / "gavel_phys_colocated_pairs.csv").write_text(
        header
        + "k80,1,A,1,B,1,1.0,2.0,2.0,4.0,0.5,0.5,1\n"
        + "k80,1,A,1,B,1,1.0,2.0,2.0,4.0,0.5,0.5,1\n"  # duplicate pair
        + "k80,2,A,1,C,1,1.0,2.0,2.0,4.0,0.5,0.5,1\n"  # consolidated not a boolean
        + "k80,1,A,1,D,1,-1.0,2.0,2.0,4.0,0.5,0.5,1\n"  # negative throughput
    )
    (batch,) = list(gavel.batches(tmp_path))
    assert batch.table == "raw.gavel_colocated" and len(batch.frame) == 1
    assert batch.frame["measurement_set"].tolist() == ["physical"]
    assert sorted((r.row_number, r.field, r.reason) for r in batch.rejections) == [
        (
            3,
            "gpu_type,consolidated,job_a,scale_factor_a,job_b,scale_factor_b",
            "duplicate key ['gpu_type', 'consolidated', 'job_a', 'scale_factor_a', 'job_b', 'scale_factor_b']",
        ),
        (4, "consolidated", "not a boolean"),
        (5, "steps_per_sec_a_colocated", "below minimum 0"),
    ]
