"""Bad input for the file loaders: hand-made cases and hypothesis fuzzing.

Every bad input must end in one of two ways: a LoadError whose message names the file (and the row/field where
known), or quarantined rows with file, row, field and reason, and nothing else lost or invented. Rows already in
the warehouse survive a failed re-load, and loading the same file twice changes nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from warehouse.db import reader
from warehouse.ingest import ingest
from warehouse.loaders import all_sources
from warehouse.loaders.base import Column, LoadError, read_checked_csv
from warehouse.loaders.cluster import POD_COLUMNS, read_csv_batch
from warehouse.loaders.energy import load_zeus_profile
from warehouse.loaders.interference import parse_oracle
from warehouse.loaders.telemetry import load_telemetry_file

# FUZZ_EXAMPLES=1000 for a longer hunt; the default keeps the file under ~20 s.
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"
GOOD_PODS = POD_HEADER + "\np0,1000,2048,1,500\np1,2000,4096,0,0\np2,4000,8192,2,1000\n"
TELEMETRY_HEADER = "timestamp, index, uuid, power.draw [W], clocks.sm [MHz], utilization.gpu [%]"


def _pods(path: Path):
    return read_csv_batch("openb_pods", "raw.openb_pods", path, path.parent, POD_COLUMNS, key=["name"])


def _sweep(path: Path):
    from warehouse.loaders.energy import SWEEP_DERIVED_COLUMNS, SWEEP_KEY

    return read_csv_batch(
        "zeus_power_sweep", "raw.zeus_power_sweep", path, path.parent, SWEEP_DERIVED_COLUMNS, key=SWEEP_KEY
    )


def _telemetry(path: Path):
    return load_telemetry_file(path)


def _profile(path: Path):
    return load_zeus_profile(path, path.parent)


def _oracle(path: Path):
    return parse_oracle(path)


# name -> (file name, loader)
LOADERS = {
    "pods": ("openb_pod_list_x.csv", _pods),
    "sweep": ("zeus_power_limit_sweep.csv", _sweep),
    "telemetry": ("node.csv", _telemetry),
    "profile": ("A40+toy+gpu0.csv", _profile),
    "oracle": ("oracle_throughputs.json", _oracle),
}


def _write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# --- hand-made cases -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "file is empty"),
        (b"  \n\n", "file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", r"file is binary \(NUL bytes\)"),
        (b"name,cpu\n\xff\xfe\xfa garbage\n", r"row 2: not UTF-8 text"),
    ],
    ids=["empty", "blank", "binary", "latin1"],
)
def test_unloadable_files_name_the_file(tmp_path, loader, content, message):
    name, load = LOADERS[loader]
    path = _write(tmp_path, name, content)
    with pytest.raises(LoadError, match=message) as info:
        load(path)
    assert str(info.value).startswith(str(path)) and info.value.file == str(path)


def test_wrong_or_missing_header(tmp_path):
    wrong = _write(tmp_path, "a.csv", GOOD_PODS.replace("cpu_milli", "cpu"))
    with pytest.raises(
        LoadError,
        match=r"a\.csv, row 1, field 'cpu_milli': missing column; header is \['name', "
        r"'cpu', ",
    ):
        _pods(wrong)
    headerless = _write(tmp_path, "b.csv", GOOD_PODS.split("\n", 1)[1])
    with pytest.raises(LoadError, match=r"b\.csv, row 1, field 'name': missing column"):
        _pods(headerless)
    sweep = _write(tmp_path, "c.csv", "gpu_type,dataset\nA40,cifar100\n")
    with pytest.raises(LoadError, match=r"c\.csv, row 1, field 'network': missing column"):
        _sweep(sweep)
    profile = _write(tmp_path, "A40+toy+gpu0.csv", "start_time,window_name,elapsed_time\n1,w_100,2\n")
    with pytest.raises(LoadError, match=r"gpu0\.csv, row 1, field 'gpu<i>_energy': no gpu<i>_energy column"):
        _profile(profile)
    telemetry = _write(tmp_path, "t.csv", "date,gpu,power\n2024-01-01,0,100\n")
    with pytest.raises(LoadError, match=r"t\.csv, row 1: not a GPU telemetry log"):
        _telemetry(telemetry)


def test_truncated_files(tmp_path):
    # cut in the middle of the last row: the short row is quarantined, the others load
    pods = _write(tmp_path, "pods.csv", GOOD_PODS[: GOOD_PODS.rindex(",") - 2])
    batch = _pods(pods)
    assert batch.frame["name"].tolist() == ["p0", "p1"]
    assert [(r.file, r.row_number, r.field, r.reason) for r in batch.rejections] == [
        (str(pods), 4, "num_gpu", "missing value")
    ]
    text = (Path(__file__).parent.parent / "fixtures/telemetry/nvidia-smi_node-a.csv").read_text()
    cut = _write(tmp_path, "node.csv", text[: len(text) // 2])
    batch = load_telemetry_file(cut)
    lines = cut.read_text().count("\n") + 1
    assert len(batch.frame) == lines - 2
    (rejection,) = batch.rejections
    assert rejection.row_number == lines and rejection.reason in {
        "missing value",
        "not a number (expected float)",
        "not a number (expected int)",
    }
    # cut inside a quoted field: the CSV cannot be parsed at all
    quoted = _write(tmp_path, "q.csv", POD_HEADER + '\np0,1000,2048,1,500\n"p1,2000')
    with pytest.raises(LoadError, match=r"q\.csv, row 3: malformed CSV"):
        _pods(quoted)
    extra = _write(tmp_path, "x.csv", GOOD_PODS + "p3,1,2,3,4,5,6\n")
    with pytest.raises(LoadError, match=r"x\.csv, row 5: malformed CSV: .*Expected 5 fields"):
        _pods(extra)
    oracle = _write(tmp_path, "oracle_throughputs.json", '{"k80": {"A": {"null": 1.0, "A": [0.5, 0.')
    with pytest.raises(LoadError, match=r"oracle_throughputs\.json, row 1: malformed JSON"):
        _oracle(oracle)


def test_non_numeric_and_negative_values_are_quarantined(tmp_path):
    sweep = _write(
        tmp_path,
        "s.csv",
        "gpu_type,dataset,network,batch_size,optimizer,power_limit_w,time_per_epoch_s,"
        "avg_power_w,energy_per_epoch_j\n"
        "A40,c,r,64,adam,100,10.0,90.0,900.0\n"
        "A40,c,r,64,adam,125,ten,90.0,900.0\n"
        "A40,c,r,64,adam,150,10.0,-90.0,900.0\n"
        "A40,c,r,64,adam,175,10.0,90.0,inf\n",
    )
    batch = _sweep(sweep)
    assert batch.frame["power_limit_w"].tolist() == [100.0]
    assert [(r.file, r.row_number, r.field, r.value, r.reason) for r in batch.rejections] == [
        (str(sweep), 3, "time_per_epoch_s", "ten", "not a number (expected float)"),
        (str(sweep), 4, "avg_power_w", "-90.0", "below minimum 0"),
        (str(sweep), 5, "energy_per_epoch_j", "inf", "not a finite number"),
    ]
    telemetry = _write(
        tmp_path,
        "node.csv",
        TELEMETRY_HEADER + "\n"
        "2024/03/01 12:00:00.000, 0, GPU-a, -1.00 W, 1410 MHz, 87 %\n"
        "2024/03/01 12:00:00.000, 1, GPU-b, 100.00 W, fast, 87 %\n",
    )
    batch = load_telemetry_file(telemetry)
    assert batch.frame.empty
    assert sorted((r.row_number, r.field, r.reason) for r in batch.rejections) == [
        (2, "power.draw [W]", "negative power"),
        (3, "clocks.sm [MHz]", "not a number (expected float)"),
    ]


def test_duplicates_and_timezone_less_times(tmp_path):
    telemetry = _write(
        tmp_path,
        "node.csv",
        TELEMETRY_HEADER + "\n"
        "2024/03/01 12:00:00.000, 0, GPU-a, 100.00 W, 1410 MHz, 87 %\n"
        "2024/03/01 12:00:00.000, 0, GPU-a, 101.00 W, 1410 MHz, 87 %\n",
    )
    assert [(r.row_number, r.reason) for r in load_telemetry_file(telemetry).rejections] == [
        (3, "duplicate (timestamp, gpu) row")
    ]
    strict = load_telemetry_file(telemetry, tz=None)
    assert {(r.row_number, r.field, r.reason) for r in strict.rejections} == {
        (2, "timestamp", "timestamp has no time zone (pass tz=...)"),
        (3, "timestamp", "timestamp has no time zone (pass tz=...)"),
    }
    pods = _write(tmp_path, "pods.csv", POD_HEADER + "\np0,1,1,0,0\np0,2,2,0,0\n")
    assert [(r.row_number, r.field, r.value) for r in _pods(pods).rejections] == [(3, "name", "p0")]


def test_a_rejected_row_does_not_make_a_later_good_row_a_duplicate(tmp_path):
    pods = _write(tmp_path, "pods.csv", POD_HEADER + "\np0,-1,1,0,0\np0,2,2,0,0\n")
    batch = _pods(pods)
    assert batch.frame["cpu_milli"].tolist() == [2]
    assert [(r.row_number, r.reason) for r in batch.rejections] == [(2, "below minimum 0")]


def test_row_numbers_count_blank_lines(tmp_path):
    pods = _write(tmp_path, "pods.csv", POD_HEADER + "\n\np0,1,1,0,0\n\n\np1,x,1,0,0\n")
    (rejection,) = _pods(pods).rejections
    assert rejection.row_number == 6 and pods.read_text().split("\n")[5].startswith("p1,x")


def _pod_data_dir(root: Path, content: str | bytes) -> Path:
    folder = root / "openb"
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder, "openb_pod_list_default.csv", content)
    return root


def _table(query: str):
    with reader() as con:
        return con.execute(query).fetchall()


@pytest.mark.parametrize(
    "bad",
    [b"", b"\x00\x01\x02garbage", POD_HEADER.replace("name", "pod").encode()],
    ids=["empty", "binary", "wrong-header"],
)
def test_failed_reload_keeps_the_rows_already_loaded(tmp_warehouse, tmp_path, bad):
    root = _pod_data_dir(tmp_path, GOOD_PODS)
    ingest(["openb_pods"], data_dir=root, progress=False)
    before = _table("SELECT * FROM raw.openb_pods ORDER BY name")
    batches_before = _table("SELECT * FROM raw._batches")
    _pod_data_dir(tmp_path, bad)
    with pytest.raises(LoadError, match="openb_pod_list_default.csv"):
        ingest(["openb_pods"], data_dir=root, progress=False)
    assert _table("SELECT * FROM raw.openb_pods ORDER BY name") == before and len(before) == 3
    assert _table("SELECT * FROM raw._batches") == batches_before


def test_loading_the_same_files_twice_is_identical(tmp_warehouse, tmp_path):
    root = _pod_data_dir(tmp_path, GOOD_PODS + "p3,-5,1,0,0\np4,1,1,0,x\n")
    shutil.copytree(
        Path(__file__).parent.parent / "fixtures" / "telemetry",
        root / "telemetry",
        ignore=shutil.ignore_patterns("*.py"),
    )

    def snapshot():
        return (
            _table("SELECT * FROM raw.openb_pods ORDER BY name"),
            _table("SELECT * FROM raw.gpu_telemetry ORDER BY host, gpu_index, ts_utc"),
            _table("SELECT * FROM quarantine.rejected_rows ORDER BY batch_id, row_number"),
        )

    first = ingest(["openb_pods", "telemetry"], data_dir=root, progress=False)
    once = snapshot()
    second = ingest(["openb_pods", "telemetry"], data_dir=root, progress=False)
    assert snapshot() == once
    assert [r.rows for r in first] == [r.rows for r in second] and all(r.skipped_unchanged for r in second)
    # nvidia-smi, nvidia-smi (no units), DCGM, CodeCarbon and Zeus fixtures
    assert len(once[0]) == 3 and len(once[1]) == 320 + 242 + 60 + 5 + 4 and len(once[2]) == 2


# --- hypothesis ------------------------------------------------------------------------------------------------------

CELL = st.one_of(
    st.integers(0, 10**7).map(str),
    st.sampled_from(["", " ", "-1", "1.5", "abc", "1e3", "inf", "-0", " 42 ", "+7", "9" * 20, "0.0", "NaN"]),
)
NAME = st.text(alphabet="abc 1", max_size=3)


def _expected_pod_value(text: str, max_value: float | None) -> str | None:
    """Reference check of one integer cell: None if valid, else the reason."""
    value = text.strip()
    if value == "":
        return "missing value"
    try:
        number = float(value)
    except ValueError:
        return "not a number (expected int)"
    if math.isnan(number):
        return "not a number (expected int)"
    if math.isinf(number):
        return "not a finite number"
    if number != math.floor(number):
        return "not an integer"
    if abs(number) >= 2.0**63:
        return "integer out of range (64-bit)"
    if number < 0:
        return "below minimum 0"
    if max_value is not None and number > max_value:
        return f"above maximum {max_value}"
    return None


@FUZZ
@given(rows=st.lists(st.tuples(NAME, CELL, CELL, CELL, CELL, st.integers(0, 2)), max_size=12))
def test_fuzz_pod_rows_are_kept_or_quarantined_exactly(rows):
    """Every data row either loads or is quarantined once, at the right line, with the reference reason."""
    lines = [POD_HEADER]
    expected_good, expected_bad, seen = [], {}, set()
    for name, cpu, mem, ngpu, gmilli, blanks in rows:
        lines.extend([""] * blanks)
        lines.append(",".join((name, cpu, mem, ngpu, gmilli)))
        line_no = len(lines)
        reason = None
        if name.strip() == "":
            reason = ("name", "missing value")
        for field, cell, top in (
            ("cpu_milli", cpu, None),
            ("memory_mib", mem, None),
            ("num_gpu", ngpu, None),
            ("gpu_milli", gmilli, 1000),
        ):
            why = _expected_pod_value(cell, top)
            if reason is None and why is not None:
                reason = (field, why)
        if reason is None and name.strip() in seen:
            reason = ("name", "duplicate key ['name']")
        if reason is None:
            seen.add(name.strip())
            expected_good.append(name.strip())
        else:
            expected_bad[line_no] = reason
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "openb_pod_list_fuzz.csv", "\n".join(lines) + "\n")
        batch = _pods(path)
        file_lines = path.read_text().split("\n")
    assert batch.frame["name"].tolist() == expected_good
    got = {r.row_number: (r.field, r.reason) for r in batch.rejections}
    assert got == expected_bad
    for r in batch.rejections:
        assert r.file == str(path) and r.record is not None
        assert file_lines[r.row_number - 1].startswith(r.record["name"] if isinstance(r.record["name"], str) else "")


@FUZZ
@given(
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from(["[N/A]", "fast", "", "12 mW"])
        ),
        min_size=1,
        max_size=10,
    ),
    unit=st.sampled_from([" W", "", "W"]),
)
def test_fuzz_telemetry_power(values, unit):
    lines = [TELEMETRY_HEADER]
    for i, value in enumerate(values):
        text = value if isinstance(value, str) else f"{value!r}{unit}"
        lines.append(f"2024/03/01 12:00:{i:02d}.000, 0, GPU-a, {text}, 1410 MHz, 50 %")
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "node.csv", "\n".join(lines) + "\n")
        batch = load_telemetry_file(path)
    assert len(batch.frame) + len(batch.rejections) == len(values)
    assert (batch.frame["power_w"] >= 0).all() and batch.frame["power_w"].notna().all()
    for r in batch.rejections:
        value = values[r.row_number - 2]
        assert r.field == "power.draw [W]" and r.file == str(path)
        if isinstance(value, float) and value < 0 and math.isfinite(value):
            assert r.reason == "negative power"
    for value, power in zip(
        [v for v in values if isinstance(v, float) and math.isfinite(v) and v >= 0 and v <= 5000],
        batch.frame["power_w"],
    ):
        assert power == pytest.approx(float(repr(value)))


@FUZZ
@given(
    rows=st.lists(
        st.lists(st.text(alphabet=' \t\xa0a,"\n', max_size=5), min_size=2, max_size=2), min_size=1, max_size=6
    )
)
def test_fuzz_string_fields_are_stripped(rows):
    """String cells come back stripped (None when blank), whatever the quoting and whitespace."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["a", "b"])
    writer.writerows(rows)
    text = buffer.getvalue()
    expected = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "s.csv", text)
        frame, rejections = read_checked_csv(
            path, [Column("a", "str", nullable=True), Column("b", "str", nullable=True)]
        )
    assert rejections == [] and len(frame) == len(expected)
    for col in ("a", "b"):
        want = [None if pd.isna(v) or v.strip() == "" else v.strip() for v in expected[col]]
        got = [None if pd.isna(v) or v == "" else v for v in frame[col]]
        assert got == want


@FUZZ
@given(content=st.one_of(st.binary(max_size=300), st.text(max_size=300)), loader=st.sampled_from(sorted(LOADERS)))
@example(content="\r0", loader="telemetry")  # a bare CR once crashed the telemetry header reader (csv.Error)
@example(content=b"\x1c", loader="profile")  # str.splitlines() splits on \x1c: once an IndexError on the header
def test_fuzz_arbitrary_content_never_crashes(content, loader):
    """Random bytes or text: a LoadError naming the file, or a result whose rejections name file and reason."""
    name, load = LOADERS[loader]
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), name, content)
        try:
            result = load(path)
        except LoadError as exc:
            assert str(exc).startswith(str(path))
            return
    rejections = result.rejections if hasattr(result, "rejections") else result[2] + result[3]
    for r in rejections:
        assert r.file == str(path) and r.reason


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, width=32), st.integers(-5, 5), st.text(max_size=4)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
JOB_KEY = st.one_of(
    st.sampled_from(["A", "B (batch size 8)", "('A', 1)", "('B', 2)", "('C', 0)", "(oops"]), st.text(max_size=6)
)
ORACLE = st.dictionaries(
    st.sampled_from(["k80", "v100", "p100_unconsolidated"]),
    st.one_of(
        JSON_VALUE,
        st.dictionaries(
            JOB_KEY,
            st.one_of(
                JSON_VALUE,
                st.dictionaries(
                    st.one_of(st.just("null"), JOB_KEY),
                    st.one_of(
                        st.floats(-1, 100, width=32), st.lists(st.floats(-1, 100, width=32), max_size=3), JSON_VALUE
                    ),
                    max_size=4,
                ),
            ),
            max_size=4,
        ),
    ),
    max_size=3,
)


@FUZZ
@given(data=ORACLE)
def test_fuzz_oracle_json(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "oracle_throughputs.json", json.dumps(data))
        try:
            iso, pairs, iso_rej, pair_rej = parse_oracle(path)
        except LoadError as exc:
            assert str(exc).startswith(str(path)) and not data
            return
    assert (iso["steps_per_s"] >= 0).all() and (pairs["steps_per_s_a_colocated"] >= 0).all()
    assert not iso.duplicated(["gpu_type", "consolidated", "job_type", "scale_factor"]).any()
    for r in iso_rej + pair_rej:
        assert r.file == str(path) and r.field and r.reason


def test_source_registry_is_complete():
    names = set(all_sources())
    assert {
        "openb_pods",
        "openb_nodes",
        "pai_machine_specs",
        "philly_runtimes",
        "philly_job_distribution",
        "zeus_power_sweep",
        "zeus_train_summary",
        "zeus_profiles",
        "mlenergy_v2",
        "mlenergy_v3",
        "acmetrace",
        "gavel",
        "telemetry",
    } <= names
