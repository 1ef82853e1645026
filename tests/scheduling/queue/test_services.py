"""Inference services into the queue: the example file lands as written, a bad service is refused naming every bad
field (parsing and the checks against the serving data, the fleet and the rate source) and quarantined while the
good ones land, the same file again changes nothing, a changed spec needs --replace, and a queue file's services
are not read as jobs."""

from __future__ import annotations

import duckdb
import pytest
import yaml

from scheduling.queue.files import JobFileError, read_job_file
from scheduling.queue.service_intake import list_services, submit_service_file
from warehouse.config import REPO_ROOT

EXAMPLE = REPO_ROOT / "docs/examples/services.yaml"
AS_OF = "2021-07-15T00:00Z"


def _file(tmp_path, services, name="services.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"services": services}, sort_keys=False))
    return path


def _quarantined(db):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT field, reason FROM quarantine.rejected_rows WHERE table_name = 'queue.services' ORDER BY field"
        ).fetchall()


def test_the_example_services_land_as_written(tmp_path, data_dir):
    db = tmp_path / "w.duckdb"
    report = submit_service_file(EXAMPLE, as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert report.counts == {"accepted": 3, "unchanged": 0, "replaced": 0, "rejected": 0}, report.to_dict()
    stored = list_services(db).set_index("service_id")
    written = {s["service_id"]: s for s in yaml.safe_load(EXAMPLE.read_text())["services"]}
    assert set(stored.index) == set(written)
    for sid, spec in written.items():
        row = stored.loc[sid]
        assert (row["model"], row["latency_slo_ms"], row["home_region"], row["rate_source"]) == (
            spec["model"], spec["latency_slo_ms"], spec["home_region"], spec["rate_source"])  # fmt: skip
        assert sorted(row["allowed_regions"]) == sorted(spec.get("allowed_regions", []))
        assert row["min_replicas"] == spec.get("min_replicas", 1) and row["latency_kind"] == "p90_itl"
    assert str(stored.loc["chat-small", "submitted_at"]).startswith("2021-07-15 00:00:00")
    again = submit_service_file(EXAMPLE, as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert again.counts["unchanged"] == 3


def test_a_bad_service_is_refused_naming_every_bad_field_and_the_good_ones_land(tmp_path, data_dir):
    db = tmp_path / "w.duckdb"
    good = yaml.safe_load(EXAMPLE.read_text())["services"][2]
    bad = {**good, "service_id": "bad", "model": "gpt-9", "latency_slo_ms": -1, "home_region": "mars",
           "rate_source": "servegen:nope", "replicas": 3}  # fmt: skip
    wrong_gpu = {**good, "service_id": "on-v100", "gpu_models": ["V100"]}
    report = submit_service_file(_file(tmp_path, [good, bad, wrong_gpu]), as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert report.counts["accepted"] == 1 and report.counts["rejected"] == 2
    by_job = {o.job: {e["field"] for e in o.errors} for o in report.rejected}
    assert by_job == {
        "ml/bad": {"replicas", "latency_slo_ms", "model", "home_region", "rate_source"},
        "ml/on-v100": {"gpu_models"},
    }
    rows = _quarantined(db)
    assert sorted(f for f, _ in rows) == sorted([*by_job["ml/bad"], "gpu_models"])
    assert all("service ml/" in reason and "line " in reason for _, reason in rows)
    assert list(list_services(db)["service_id"]) == ["chat-small"]
    # the same file again: the same rejections, nothing rewritten
    submit_service_file(tmp_path / "services.yaml", as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert _quarantined(db) == rows


def test_a_changed_service_needs_replace_and_an_id_given_twice_is_refused(tmp_path, data_dir):
    db = tmp_path / "w.duckdb"
    good = yaml.safe_load(EXAMPLE.read_text())["services"][2]
    submit_service_file(_file(tmp_path, [good]), as_of=AS_OF, db_path=db, data_dir=data_dir)
    changed = _file(tmp_path, [{**good, "latency_slo_ms": 80}], "changed.yaml")
    assert submit_service_file(changed, as_of=AS_OF, db_path=db, data_dir=data_dir).counts["rejected"] == 1
    assert submit_service_file(changed, as_of=AS_OF, replace=True, db_path=db, data_dir=data_dir).counts[
        "replaced"] == 1  # fmt: skip
    assert list_services(db)["latency_slo_ms"].tolist() == [80.0]
    twice = submit_service_file(_file(tmp_path, [good, good], "twice.yaml"), as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert twice.counts["rejected"] == 2


def test_a_file_of_services_is_not_a_job_file(tmp_path):
    path = _file(tmp_path, [{"service_id": "x"}])
    with pytest.raises(JobFileError, match="no top-level `jobs:` list"):
        read_job_file(path)
    assert len(read_job_file(path, key="services")) == 1


def test_a_relative_rate_file_is_stored_absolute_and_read_from_anywhere(tmp_path, data_dir, monkeypatch):
    import pandas as pd

    from scheduling.queue.service_rates import rate_history

    folder = tmp_path / "team"
    folder.mkdir()
    hours = pd.date_range("2021-07-14T00:00Z", periods=24, freq="h")
    pd.DataFrame({"hour_utc": hours, "requests_per_s": 2.0, "mean_output_tokens": 100.0}).to_csv(
        folder / "rates.csv", index=False
    )
    spec = {**yaml.safe_load(EXAMPLE.read_text())["services"][2], "rate_source": "file:rates.csv", "rate_scale": 0.5}
    db = tmp_path / "w.duckdb"
    report = submit_service_file(_file(folder, [spec]), as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert report.counts["accepted"] == 1, report.to_dict()
    row = list_services(db).iloc[0]
    assert row["rate_source"] == f"file:{(folder / 'rates.csv').resolve()}"
    monkeypatch.chdir(tmp_path)  # the loop runs from elsewhere
    got = rate_history(row, hours[0], hours[-1] + pd.Timedelta(hours=1))
    assert got["demand_tokens_per_s"].tolist() == [2.0 * 0.5 * 100.0] * 24
    # the same file again: unchanged (the stored spec is the absolute one both times)
    again = submit_service_file(_file(folder, [spec]), as_of=AS_OF, db_path=db, data_dir=data_dir)
    assert again.counts["unchanged"] == 1
