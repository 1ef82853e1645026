"""GPU telemetry loader: nvidia-smi and DCGM-exporter CSV logs (fixtures in tests/fixtures/telemetry)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from warehouse.db import load_batch, reader, writer
from warehouse.ingest import ingest
from warehouse.loaders.base import LoadError
from warehouse.loaders.telemetry import OUTPUT_COLUMNS, detect_format, load_telemetry_file, telemetry

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "telemetry"
NVSMI = FIXTURES / "nvidia-smi_node-a.csv"
DCGM = FIXTURES / "dcgm_node-b.csv"
NOUNITS = FIXTURES / "nvidia-smi_nounits_node-c.csv"
NVSMI_HEADER = "timestamp, index, uuid, power.draw [W], clocks.sm [MHz], utilization.gpu [%]\n"


def _write(tmp_path: Path, text: str, name: str = "log.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _reasons(batch) -> list[tuple[int, str, str]]:
    return sorted((r.row_number, r.field, r.reason) for r in batch.rejections)


def test_nvidia_smi_fixture_local_time_and_power_limit_change():
    batch = load_telemetry_file(NVSMI, tz="Europe/Berlin", host="node-a")
    frame = batch.frame
    assert batch.rejections == [] and len(frame) == 320 and list(frame.columns) == OUTPUT_COLUMNS
    assert batch.table == "raw.gpu_telemetry" and batch.source == "telemetry"
    assert set(frame["log_format"]) == {"nvidia-smi"} and set(frame["source_tz"]) == {"Europe/Berlin"}
    assert set(frame["host"]) == {"node-a"} and frame.groupby("gpu_index").size().to_dict() == {
        0: 80,
        1: 80,
        2: 80,
        3: 80,
    }
    # 13:00:00.117 in Berlin (CET, UTC+1) is 12:00:00.117 UTC
    assert frame["ts_utc"].min() == pd.Timestamp("2024-03-01 12:00:00.117", tz="UTC")
    assert set(frame["gpu_model"]) == {"NVIDIA A100-SXM4-80GB"} and frame["gpu_uuid"].str.startswith("GPU-").all()
    cap = pd.Timestamp("2024-03-01 12:01:20", tz="UTC")
    before, after = frame[frame["ts_utc"] < cap], frame[frame["ts_utc"] >= cap]
    for gpu in (0, 1):  # capped 400 W -> 250 W: power and SM clock drop
        b, a = before[before["gpu_index"] == gpu], after[after["gpu_index"] == gpu]
        assert set(b["power_limit_w"]) == {400.0} and set(a["power_limit_w"]) == {250.0}
        assert b["sm_clock_mhz"].mean() - a["sm_clock_mhz"].mean() > 250
        assert a["power_w"].max() <= 250 and b["power_w"].mean() > 330
    for gpu in (2, 3):
        assert set(frame.loc[frame["gpu_index"] == gpu, "power_limit_w"]) == {400.0}
        assert after.loc[after["gpu_index"] == gpu, "sm_clock_mhz"].min() >= 1395


def test_nvidia_smi_energy_is_integrated_with_trapezoid():
    frame = load_telemetry_file(NVSMI, tz="Europe/Berlin").frame
    assert set(frame["energy_source"]) == {"integrated"} and frame["energy_counter_j"].isna().all()
    gpu0 = frame[frame["gpu_index"] == 0].sort_values("ts_utc")
    assert pd.isna(gpu0["energy_j"].iloc[0])  # nothing before the first sample
    t = (gpu0["ts_utc"] - gpu0["ts_utc"].iloc[0]).dt.total_seconds().to_numpy()
    p = gpu0["power_w"].to_numpy(dtype=float)
    assert gpu0["energy_j"].sum() == pytest.approx(np.trapezoid(p, t), rel=1e-9)
    assert gpu0["energy_j"].iloc[1] == pytest.approx((p[0] + p[1]) / 2 * (t[1] - t[0]))


def test_default_tz_is_utc_and_host_defaults_to_file_name():
    frame = load_telemetry_file(NVSMI).frame
    assert set(frame["source_tz"]) == {"UTC"} and set(frame["host"]) == {"nvidia-smi_node-a"}
    assert frame["ts_utc"].min() == pd.Timestamp("2024-03-01 13:00:00.117", tz="UTC")


def test_dcgm_fixture_measured_energy_matches_power():
    batch = load_telemetry_file(DCGM)
    frame = batch.frame
    assert batch.rejections == [] and len(frame) == 242
    assert set(frame["log_format"]) == {"dcgm"} and set(frame["host"]) == {"node-b"}
    assert set(frame["energy_source"]) == {"measured"}
    assert frame["source_tz"].isna().all()  # ISO timestamps with Z: no zone was assumed
    assert frame["ts_utc"].min() == pd.Timestamp("2024-03-01 12:00:00", tz="UTC")
    for _, sub in frame.groupby("gpu_index"):
        sub = sub.sort_values("ts_utc")
        t = (sub["ts_utc"] - sub["ts_utc"].iloc[0]).dt.total_seconds().to_numpy()
        integrated = np.trapezoid(sub["power_w"].to_numpy(dtype=float), t)
        assert sub["energy_j"].sum() == pytest.approx(integrated, rel=0.02)  # counter vs sampled power
        counter = sub["energy_counter_j"].to_numpy(dtype=float)
        assert sub["energy_j"].sum() == pytest.approx(counter[-1] - counter[0])
    gpu1 = frame[frame["gpu_index"] == 1]
    cap = pd.Timestamp("2024-03-01 12:05:00", tz="UTC")
    assert gpu1.loc[gpu1["ts_utc"] < cap, "sm_clock_mhz"].mean() > 1900
    assert gpu1.loc[gpu1["ts_utc"] >= cap, "sm_clock_mhz"].mean() < 1600
    assert gpu1.loc[gpu1["ts_utc"] >= cap, "power_w"].max() <= 400


def test_nounits_and_not_available_values():
    batch = load_telemetry_file(NOUNITS)
    assert batch.rejections == [] and len(batch.frame) == 60
    assert batch.frame["gpu_util_pct"].isna().sum() == 2  # [N/A] -> NULL, row kept
    assert batch.frame["gpu_uuid"].isna().all() and batch.frame["power_limit_w"].isna().all()


def test_loaded_types_in_the_warehouse(tmp_warehouse):
    with writer() as con:
        load_batch(con, load_telemetry_file(DCGM))
        load_batch(con, load_telemetry_file(NVSMI, tz="Europe/Berlin", host="node-a"))
    with reader() as con:
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'raw' AND table_name = 'gpu_telemetry'"
            ).fetchall()
        )
        hosts = dict(con.execute("SELECT host, count(*) FROM raw.gpu_telemetry GROUP BY 1").fetchall())
    assert types["ts_utc"] == "TIMESTAMP WITH TIME ZONE" and types["power_w"] == "DOUBLE"
    assert types["gpu_index"] == "BIGINT" and types["energy_source"] == "VARCHAR"
    assert hosts == {"node-a": 320, "node-b": 242}


def test_source_reads_data_dir_telemetry_with_sidecar(tmp_warehouse, tmp_path, data_dir):
    assert telemetry.files(data_dir) == []  # nothing in the shared data
    folder = tmp_path / "telemetry" / "rack1"
    folder.mkdir(parents=True)
    shutil.copy(NVSMI, folder / "node-a.csv")
    (folder / "node-a.json").write_text(json.dumps({"tz": "Europe/Berlin", "host": "node-a"}))
    shutil.copy(DCGM, folder / "node-b.csv")
    results = ingest(["telemetry"], data_dir=tmp_path, progress=False)
    assert sorted((r.batch_id, r.rows) for r in results) == [
        ("telemetry:telemetry/rack1/node-a.csv", 320),
        ("telemetry:telemetry/rack1/node-b.csv", 242),
    ]
    with reader() as con:
        first = con.execute(
            "SELECT min(ts_utc), any_value(source_tz) FROM raw.gpu_telemetry WHERE host = 'node-a'"
        ).fetchone()
    assert first[0] == pd.Timestamp("2024-03-01 12:00:00.117", tz="UTC") and first[1] == "Europe/Berlin"
    assert all(r.skipped_unchanged for r in ingest(["telemetry"], data_dir=tmp_path, progress=False))


def test_negative_power_and_bad_values_are_quarantined(tmp_path):
    path = _write(
        tmp_path,
        NVSMI_HEADER
        + "2024/03/01 12:00:00.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:00.000, 1, GPU-b, -12.00 W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:01.000, 0, GPU-a, lots W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:01.000, 1, GPU-b, 245 mW, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:02.000, 0, GPU-a, [N/A], 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:02.000, 1, GPU-b, 200.00 W, 1410 MHz, 187 %\n"
        + "2024/03/01 12:00:03.000, 0, GPU-a, 200.00 W, 1410 MHz, 87 %\n",
    )
    batch = load_telemetry_file(path)
    assert len(batch.frame) == 2
    assert _reasons(batch) == [
        (3, "power.draw [W]", "negative power"),
        (4, "power.draw [W]", "not a number (expected float)"),
        (5, "power.draw [W]", "unexpected unit (expected W)"),
        (6, "power.draw [W]", "missing value"),
        (7, "utilization.gpu [%]", "above maximum 100"),
    ]
    (rejection,) = [r for r in batch.rejections if r.row_number == 3]
    assert rejection.file == str(path) and rejection.value == "-12.00 W" and rejection.record["index"] == "1"


def test_duplicate_timestamp_per_gpu_is_quarantined(tmp_path):
    path = _write(
        tmp_path,
        NVSMI_HEADER
        + "2024/03/01 12:00:00.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:00.000, 1, GPU-b, 245.31 W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:00.000, 0, GPU-a, 250.00 W, 1410 MHz, 87 %\n",
    )
    batch = load_telemetry_file(path)
    assert len(batch.frame) == 2 and batch.frame["power_w"].tolist() == [245.31, 245.31]
    assert _reasons(batch) == [(4, "timestamp", "duplicate (timestamp, gpu) row")]


def test_timezone_handling(tmp_path):
    rows = (
        "2024/03/01 12:00:00.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
        "2024/03/01 12:00:01.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
    )
    path = _write(tmp_path, NVSMI_HEADER + rows)
    strict = load_telemetry_file(path, tz=None)
    assert strict.frame.empty and _reasons(strict) == [
        (2, "timestamp", "timestamp has no time zone (pass tz=...)"),
        (3, "timestamp", "timestamp has no time zone (pass tz=...)"),
    ]
    ny = load_telemetry_file(path, tz="America/New_York").frame
    assert ny["ts_utc"].iloc[0] == pd.Timestamp("2024-03-01 17:00:00", tz="UTC")
    assert set(ny["source_tz"]) == {"America/New_York"}
    mixed = _write(
        tmp_path,
        NVSMI_HEADER
        + "2024-03-01T12:00:00+01:00, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
        + "2024/03/01 12:00:01.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n",
        "mixed.csv",
    )
    batch = load_telemetry_file(mixed)
    assert batch.frame["ts_utc"].tolist() == [pd.Timestamp("2024-03-01 11:00:00", tz="UTC")]
    assert _reasons(batch) == [(3, "timestamp", "timestamp has no time zone while other rows of the file have one")]
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        load_telemetry_file(path, tz="Mars/Olympus")


def test_daylight_saving_gap_and_overlap_are_quarantined(tmp_path):
    path = _write(
        tmp_path,
        NVSMI_HEADER
        + "2024/03/31 01:59:59.000, 0, GPU-a, 200 W, 1410 MHz, 87 %\n"
        + "2024/03/31 02:30:00.000, 0, GPU-a, 200 W, 1410 MHz, 87 %\n"  # does not exist in Berlin
        + "2024/03/31 03:00:01.000, 0, GPU-a, 200 W, 1410 MHz, 87 %\n"
        + "2024/10/27 02:30:00.000, 0, GPU-a, 200 W, 1410 MHz, 87 %\n",
    )  # happens twice
    batch = load_telemetry_file(path, tz="Europe/Berlin")
    assert batch.frame["ts_utc"].tolist() == [
        pd.Timestamp("2024-03-31 00:59:59", tz="UTC"),
        pd.Timestamp("2024-03-31 01:00:01", tz="UTC"),
    ]
    assert [r[0] for r in _reasons(batch)] == [3, 5]
    assert all("daylight saving" in r.reason for r in batch.rejections)


def test_dcgm_epoch_timestamps_counter_reset_and_gaps(tmp_path):
    header = "timestamp,gpu,UUID,modelName,Hostname,DCGM_FI_DEV_POWER_USAGE,DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\n"
    path = _write(
        tmp_path,
        header
        + "1709294400,0,GPU-a,H100,n1,100.0,5000000\n"
        + "1709294410,0,GPU-a,H100,n1,100.0,6000000\n"
        + "1709294420,0,GPU-a,H100,n1,100.0,400000\n"  # counter reset (driver reload)
        + "1709294400000,1,GPU-b,H100,n1,50.0,\n"  # ms epoch, GPU 1 has no counter: integrated
        + "1709294410000,1,GPU-b,H100,n1,70.0,\n"
        + "1709295410000,1,GPU-b,H100,n1,70.0,\n",
    )  # 1000 s gap: not integrated
    frame = load_telemetry_file(path).frame
    gpu0, gpu1 = frame[frame["gpu_index"] == 0], frame[frame["gpu_index"] == 1]
    assert gpu0["ts_utc"].iloc[0] == gpu1["ts_utc"].iloc[0] == pd.Timestamp("2024-03-01 12:00:00", tz="UTC")
    assert gpu0["energy_j"].tolist() == [pd.NA, 1000.0, 400.0] and set(gpu0["energy_source"]) == {"measured"}
    assert gpu1["energy_j"].tolist() == [pd.NA, 600.0, pd.NA] and set(gpu1["energy_source"]) == {"integrated"}
    no_gap_limit = load_telemetry_file(path, max_gap_s=None).frame
    assert no_gap_limit.loc[no_gap_limit["gpu_index"] == 1, "energy_j"].iloc[2] == 70_000.0


def test_repeated_header_is_skipped(tmp_path):
    row = "2024/03/01 12:00:0{}.000, 0, GPU-a, 245.31 W, 1410 MHz, 87 %\n"
    path = _write(tmp_path, NVSMI_HEADER + row.format(0) + NVSMI_HEADER + row.format(1))
    batch = load_telemetry_file(path)
    assert len(batch.frame) == 2 and batch.rejections == []


def test_unknown_log_is_a_load_error(tmp_path):
    path = _write(tmp_path, "time,gpu,watts\n1,0,100\n")
    with pytest.raises(LoadError, match=r"log\.csv, row 1: not a GPU telemetry log"):
        load_telemetry_file(path)
    missing_index = _write(tmp_path, "timestamp, uuid, power.draw [W]\n2024/03/01 12:00:00.000, GPU-a, 1 W\n", "m.csv")
    with pytest.raises(LoadError, match=r"m\.csv, row 1, field 'index': missing column"):
        load_telemetry_file(missing_index)
    assert detect_format(["timestamp", "index", "power.draw [W]"]) == "nvidia-smi"
    assert detect_format(["timestamp", "gpu", "DCGM_FI_DEV_POWER_USAGE"]) == "dcgm"
