"""Job energy meters in the telemetry loader: CodeCarbon emissions.csv and ZeusMonitor logs (fixtures in
tests/fixtures/telemetry, written as CodeCarbon 3.3.2 and Zeus 0.16 write them)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from warehouse.db import reader
from warehouse.ingest import ingest
from warehouse.loaders.base import LoadError
from warehouse.loaders.telemetry import OUTPUT_COLUMNS, detect_format, load_telemetry_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "telemetry"
CODECARBON = FIXTURES / "codecarbon_node-d.csv"
ZEUS = FIXTURES / "zeus_node-e.csv"


def _reasons(batch) -> list[tuple[int, str, str]]:
    return sorted((r.row_number, r.field, r.reason) for r in batch.rejections)


def _codecarbon_rows() -> tuple[list[str], list[dict[str, str]]]:
    with CODECARBON.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return list(rows[0]), rows


def _write_codecarbon(path: Path, header: list[str], rows: list[dict[str, str]]) -> Path:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue())
    return path


def test_codecarbon_fixture_rows_are_the_runs_energy_keyed_to_jobs():
    batch = load_telemetry_file(CODECARBON, tz="Europe/Berlin")
    frame = batch.frame
    assert batch.rejections == [] and len(frame) == 5 and list(frame.columns) == OUTPUT_COLUMNS
    assert set(frame["log_format"]) == {"codecarbon"} and set(frame["energy_scope"]) == {"machine"}
    assert set(frame["energy_source"]) == {"measured"} and frame["gpu_index"].isna().all()
    assert set(frame["source_tz"]) == {"Europe/Berlin"} and set(frame["host"]) == {"codecarbon_node-d"}
    source = pd.read_csv(CODECARBON)
    for (job, run), rows in source.groupby(["project_name", "run_id"]):
        got = frame[(frame["job_key"] == job) & (frame["meter_run_id"] == run)].sort_values("ts_utc")
        # the rows are running totals: their differences add up to the run's last total (kWh -> J)
        assert got["energy_j"].sum() == pytest.approx(rows["energy_consumed"].iloc[-1] * 3.6e6, rel=1e-12)
        assert got["energy_counter_j"].iloc[-1] == pytest.approx(rows["energy_consumed"].iloc[-1] * 3.6e6)
        # 14:56:00 CEST is 12:56:00 UTC; the first window starts `duration` before the first row
        first_ts = pd.Timestamp(rows["timestamp"].iloc[0]).tz_localize("Europe/Berlin").tz_convert("UTC")
        assert got["ts_utc"].iloc[0] == first_ts
        start = first_ts - pd.Timedelta(seconds=rows["duration"].iloc[0])
        assert abs(got["window_start_utc"].iloc[0] - start) < pd.Timedelta(microseconds=1)
        seconds = (got["ts_utc"] - got["window_start_utc"]).dt.total_seconds()
        assert (got["power_w"] * seconds).to_numpy() == pytest.approx(got["energy_j"].to_numpy(), rel=1e-6)
    resnet = frame[frame["job_key"] == "lab/resnet50-cc"]
    assert len(resnet) == 4 and 350 < resnet["power_w"].mean() < 400  # 1 GPU ~290 W + CPU 42.5 W + RAM 37.8 W


def test_zeus_fixture_one_row_per_window_and_gpu():
    batch = load_telemetry_file(ZEUS)
    frame = batch.frame
    assert batch.rejections == [] and len(frame) == 4 and list(frame.columns) == OUTPUT_COLUMNS
    assert set(frame["log_format"]) == {"zeus"} and set(frame["energy_scope"]) == {"gpu"}
    assert set(frame["job_key"]) == {"lab/vit-zeus"} and frame["source_tz"].isna().all()
    source = pd.read_csv(ZEUS)
    assert frame["energy_j"].sum() == pytest.approx(source[["gpu0_energy", "gpu1_energy"]].to_numpy().sum())
    first = frame[frame["gpu_index"] == 1].sort_values("ts_utc").iloc[0]
    start = pd.Timestamp(source["start_time"].iloc[0], unit="s", tz="UTC")
    assert abs(first["window_start_utc"] - start) < pd.Timedelta(microseconds=1)
    assert abs(first["ts_utc"] - start - pd.Timedelta(seconds=source["elapsed_time"].iloc[0])) < pd.Timedelta(
        microseconds=1
    )
    assert first["energy_j"] == source["gpu1_energy"].iloc[0]
    assert first["power_w"] == pytest.approx(source["gpu1_energy"].iloc[0] / source["elapsed_time"].iloc[0])


def test_detect_format_of_meter_headers():
    header, _ = _codecarbon_rows()
    assert detect_format(header) == "codecarbon"
    assert detect_format(["start_time", "window_name", "elapsed_time", "gpu0_energy"]) == "zeus"


def test_codecarbon_bad_rows_are_quarantined_naming_file_row_and_field(tmp_path):
    header, rows = _codecarbon_rows()
    resnet = [r for r in rows if r["project_name"] == "lab/resnet50-cc"]
    bert = next(r for r in rows if r["project_name"] == "lab/bert-cc")
    bad = [dict(bert, run_id=f"run-{i}") for i in range(9)]
    bad[0]["project_name"] = "codecarbon"  # CodeCarbon's default project name: no job
    bad[1]["energy_consumed"] = "-0.25"
    bad[2]["energy_consumed"] = ""  # NaN, as pandas writes it
    bad[3]["energy_consumed"] = str(float(bert["energy_consumed"]) * 1000)  # Wh, not kWh
    bad[4]["energy_consumed"] = "0.25 kWh"
    bad[5]["timestamp"] = "2021-07-15 quarter past two"
    bad[6]["timestamp"] = "2021-03-28T02:30:00"  # does not exist in Berlin
    bad[7]["duration"] = "nan"
    bad[8]["project_name"] = ""
    falls = dict(resnet[2], energy_consumed=str(float(resnet[1]["energy_consumed"]) - 0.01))
    repeated = dict(resnet[1], timestamp=resnet[1]["timestamp"])
    path = _write_codecarbon(tmp_path / "emissions.csv", header, [resnet[0], resnet[1], repeated, falls, *bad])
    batch = load_telemetry_file(path, tz="Europe/Berlin")
    unkeyed = "cannot be keyed to a job: project_name is not a planner job id '<tenant>/<job_id>'"
    reasons = _reasons(batch)
    assert [(line, field) for line, field, _ in reasons] == [
        (4, "duration"),
        (5, "energy_consumed"),
        (6, "project_name"),
        (7, "energy_consumed"),
        (8, "energy_consumed"),
        (9, "energy_consumed"),
        (10, "energy_consumed"),
        (11, "timestamp"),
        (12, "timestamp"),
        (13, "duration"),
        (14, "project_name"),
    ]
    text = [reason for _, _, reason in reasons]
    assert text[0] == "duplicate (run_id, duration) row: as row 3"
    assert text[1] == "energy_consumed falls below row 3 of the same run_id (a run's rows are running totals)"
    assert text[2].startswith(unkeyed) and text[10].startswith(unkeyed)
    assert text[3] == "negative energy" and text[4] == "missing value" and text[7] == "not a timestamp"
    assert text[5].startswith("implausible energy: a mean power above 100 kW") and "kWh" in text[5]
    assert text[6] == "unexpected unit (expected none)" and "daylight saving" in text[8]
    assert text[9] == "missing value"
    assert all(r.file == str(path) for r in batch.rejections)
    (neg,) = [r for r in batch.rejections if r.row_number == 7]
    assert neg.value == "-0.25" and neg.record["run_id"] == "run-1"
    # the good rows: the resnet run's first two totals
    assert batch.frame["energy_counter_j"].tolist() == pytest.approx(
        [float(resnet[0]["energy_consumed"]) * 3.6e6, float(resnet[1]["energy_consumed"]) * 3.6e6]
    )


def test_codecarbon_without_a_zone_and_tz_none_is_quarantined(tmp_path):
    batch = load_telemetry_file(CODECARBON, tz=None)
    assert batch.frame.empty and {r.reason for r in batch.rejections} == {"timestamp has no time zone (pass tz=...)"}


def test_zeus_bad_rows_are_quarantined(tmp_path):
    path = tmp_path / "zeus.csv"
    path.write_text(
        "start_time,window_name,elapsed_time,gpu0_energy,gpu1_energy\n"
        "1626351000.5,lab/job-a,100.0,30000.0,31000.0\n"
        "1626351010.5,lab/job-a,10.0,3000.0,3100.0\n"  # nested in the window above
        "1626351000.5,step_100,1.5,450.0,460.0\n"  # not a job
        "1626351200.5,lab/job-b,100.0,-5.0,31000.0\n"
        "1626351300.5,lab/job-b,100.0,nan,31000.0\n"
        "1626351400.5,lab/job-b,100.0,30000000.0,31000.0\n"  # mJ, not J
        "yesterday,lab/job-b,100.0,30000.0,31000.0\n"
        "1626351500.5,lab/job-b,100.0,30000.0\n"  # truncated
        "1626351600.5,lab/job,c,100.0,30000.0,31000.0\n"  # a comma in the window name (not quoted)
    )
    batch = load_telemetry_file(path)
    assert _reasons(batch) == [
        (3, "start_time", "window overlaps the window of row 2 for the same job (counted twice)"),
        (
            4,
            "window_name",
            "cannot be keyed to a job: window_name is not a planner job id '<tenant>/<job_id>' (name the job's "
            'window after it, or give the file a sidecar {"job": "<tenant>/<job_id>"})',
        ),
        (5, "gpu0_energy", "negative energy"),
        (6, "gpu0_energy", "missing value"),
        (7, "gpu0_energy", "implausible energy: a mean power above 5000 W over the window (gpu<i>_energy must be J)"),
        (8, "start_time", "not a Unix time in seconds"),
        (9, "gpu1_energy", "4 fields, the header has 5 (a truncated line?)"),
    ]
    assert sorted(set(batch.frame["job_key"])) == ["lab/job,c", "lab/job-a"] and len(batch.frame) == 4
    a = batch.frame[batch.frame["job_key"] == "lab/job-a"]
    assert a["energy_j"].sum() == 61000.0


def test_sidecar_job_keys_a_whole_file(tmp_path):
    path = tmp_path / "zeus.csv"
    path.write_text(
        "start_time,window_name,elapsed_time,gpu0_energy\n1626351000.5,train,100.0,30000.0\n"
        "1626351200.5,eval,10.0,2000.0\n"
    )
    batch = load_telemetry_file(path, job="lab/job-z")
    assert batch.rejections == [] and set(batch.frame["job_key"]) == {"lab/job-z"}
    assert sorted(batch.frame["meter_run_id"]) == ["eval", "train"]
    with pytest.raises(ValueError, match="'nope' is not a planner job id"):
        load_telemetry_file(path, job="nope")
    no_gpu = tmp_path / "cpu.csv"
    no_gpu.write_text("start_time,window_name,elapsed_time,\n1626351000.5,lab/a,100.0,\n")
    with pytest.raises(LoadError, match=r"cpu\.csv, row 1: a ZeusMonitor log without GPU energy columns"):
        load_telemetry_file(no_gpu)
    bad = tmp_path / "bad.csv"
    bad.write_text("start_time,window_name,elapsed_time,gpu0_power\n1,lab/a,1,1\n")
    with pytest.raises(LoadError, match=r"bad\.csv, row 1, field 'gpu0_power': not a ZeusMonitor energy column"):
        load_telemetry_file(bad)


def _snapshot() -> tuple[list, list]:
    with reader() as con:
        rows = con.execute(
            "SELECT * EXCLUDE (_loaded_at) FROM raw.gpu_telemetry ORDER BY log_format, job_key, meter_run_id, ts_utc, "
            "gpu_index"
        ).fetchall()
        rejected = con.execute(
            "SELECT file, row_number, field, reason FROM quarantine.rejected_rows ORDER BY file, row_number"
        ).fetchall()
    return rows, rejected


def test_ingest_from_data_dir_with_sidecars_is_idempotent(tmp_warehouse, tmp_path):
    folder = tmp_path / "telemetry" / "node-d" / "lab-resnet50"
    folder.mkdir(parents=True)
    shutil.copy(CODECARBON, folder / "emissions.csv")
    (folder / "emissions.json").write_text(json.dumps({"tz": "Europe/Berlin", "host": "node-d"}))
    shutil.copy(ZEUS, tmp_path / "telemetry" / "zeus_node-e.csv")
    (tmp_path / "telemetry" / "steps.csv").write_text(
        "start_time,window_name,elapsed_time,gpu0_energy\n1626351000.5,step_1,1.0,300.0\n"
    )
    first = ingest(["telemetry"], data_dir=tmp_path, progress=False)
    assert sorted((r.batch_id, r.rows, r.rejected) for r in first) == [
        ("telemetry:telemetry/node-d/lab-resnet50/emissions.csv", 5, 0),
        ("telemetry:telemetry/steps.csv", 0, 1),
        ("telemetry:telemetry/zeus_node-e.csv", 4, 0),
    ]
    rows, rejected = _snapshot()
    assert len(rows) == 9 and [r[:3] for r in rejected] == [
        (str(tmp_path / "telemetry" / "steps.csv"), 2, "window_name")
    ]
    with reader() as con:
        hosts = con.execute("SELECT DISTINCT host FROM raw.gpu_telemetry WHERE log_format = 'codecarbon'").fetchall()
    assert hosts == [("node-d",)]
    again = ingest(["telemetry"], data_dir=tmp_path, progress=False)
    assert all(r.skipped_unchanged for r in again) and _snapshot() == (rows, rejected)
