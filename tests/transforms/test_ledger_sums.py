"""The ledger models sum only through `fixed_order_sum`: a plain DuckDB sum of doubles depends on the order its
parallel aggregation meets the rows in, so the same events could give ledger rows that differ in the last bits
(tests/e2e/test_backfill_e2e.py compares ledgers by row hash)."""

from __future__ import annotations

import random
import re

import duckdb

from transforms.runner import PROJECT_DIR

LEDGER_MODELS = (
    "intermediate/jobs/int_jobs__attempts.sql",
    "intermediate/jobs/int_jobs__metered_energy.sql",
    "marts/job_runs.sql",
    "marts/job_window_carbon.sql",
    "marts/carbon_ledger.sql",
    "marts/carbon_ledger_daily.sql",
)
PLAIN_SUM = re.compile(r"(?<![\w.])sum\s*\(", re.IGNORECASE)


def test_ledger_models_use_the_fixed_order_sum():
    plain = {m: len(PLAIN_SUM.findall((PROJECT_DIR / "models" / m).read_text())) for m in LEDGER_MODELS}
    assert not any(plain.values()), plain
    assert "fixed_order_sum" in (PROJECT_DIR / "models" / "marts" / "carbon_ledger.sql").read_text()


def test_the_fixed_order_sum_gives_the_same_bits_in_any_row_order():
    values = [0.1 * (i % 7) + 1e-9 * i for i in range(2000)] + [None]
    orders = [random.Random(seed).sample(values, len(values)) for seed in range(4)]
    with duckdb.connect() as con:
        sums = {
            con.execute(
                "SELECT sum(x ORDER BY x) FILTER (WHERE x > 0.2) FROM (SELECT unnest(?::DOUBLE[]) AS x)", [order]
            ).fetchone()[0]
            for order in orders
        }
    assert len(sums) == 1
