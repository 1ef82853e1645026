import duckdb
import pandas as pd
import pytest

from warehouse.db import Batch, Rejection, load_batch, reader, writer


def _batch(values, batch_id="b1", rejections=()):
    return Batch("raw.things", batch_id, "test", pd.DataFrame({"x": values}), list(rejections))


def test_batch_replaces_its_own_rows_only(tmp_warehouse):
    with writer() as con:
        load_batch(con, _batch([1, 2, 3], "a"))
        load_batch(con, _batch([10], "b"))
        load_batch(con, _batch([4, 5], "a"))
        rows = con.execute("SELECT _batch_id, x FROM raw.things ORDER BY x").fetchall()
    assert rows == [("a", 4), ("a", 5), ("b", 10)]


def test_identical_reload_is_a_noop_and_byte_identical(tmp_warehouse):
    with writer() as con:
        first = load_batch(con, _batch([1, 2], rejections=[Rejection("bad", "f.csv", 3, "x", "q")]))
        before = con.execute("SELECT * FROM raw.things ORDER BY x").fetchall()
        second = load_batch(con, _batch([1, 2], rejections=[Rejection("bad", "f.csv", 3, "x", "q")]))
        after = con.execute("SELECT * FROM raw.things ORDER BY x").fetchall()
        quarantined = con.execute("SELECT count(*) FROM quarantine.rejected_rows").fetchone()[0]
    assert not first.skipped_unchanged and second.skipped_unchanged
    assert before == after and quarantined == 1


def test_failed_batch_rolls_back_and_keeps_loaded_rows(tmp_warehouse):
    with writer() as con:
        load_batch(con, _batch([1, 2]))
        bad = Batch("raw.things", "b1", "test", pd.DataFrame({"x": ["not-an-int"]}))
        with pytest.raises(duckdb.Error):
            load_batch(con, bad)
        assert con.execute("SELECT count(*) FROM raw.things").fetchone()[0] == 2


def test_reader_is_read_only_and_errors_without_warehouse(tmp_warehouse):
    with pytest.raises(FileNotFoundError, match="ingest --all"):
        with reader():
            pass
    with writer() as con:
        load_batch(con, _batch([1]))
    with reader() as con:
        with pytest.raises(duckdb.Error):
            con.execute("CREATE TABLE raw.nope (x INT)")


def test_session_shares_one_connection_and_holds_the_lock(tmp_warehouse):
    """Inside `session`, every reader/writer of that warehouse is the session's connection (writes visible at
    once); another warehouse still gets its own; after it, connections are separate again."""
    import fcntl

    from warehouse.db import session

    other = tmp_warehouse.parent / "other.duckdb"
    with session(tmp_warehouse):
        with writer(tmp_warehouse) as w:
            w.execute("CREATE TABLE raw.session_probe AS SELECT 1 AS x")
        with reader(tmp_warehouse) as r:
            assert r is w
            assert r.execute("SELECT x FROM raw.session_probe").fetchone() == (1,)
        with writer(other) as o:
            assert o is not w
        # the exclusive lock is held for the whole session
        with open(tmp_warehouse.with_name(tmp_warehouse.name + ".lock"), "a+") as handle:
            with pytest.raises(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    with reader(tmp_warehouse) as r1, reader(tmp_warehouse) as r2:
        assert r1 is not r2
        assert r1.execute("SELECT x FROM raw.session_probe").fetchone() == (1,)
