"""The time schedules of the DAGs, and the switch that turns them off.

`TIME_SCHEDULES=off` leaves every time-scheduled DAG (the hourly loop, the forecasts, the daily ledger) to runs
somebody triggers: an Airflow that replays history, or one driven by an outside orchestrator, then starts no run
for the wall-clock hour (a time outside its data) whenever an hour passes. Asset-scheduled DAGs are unchanged."""

from __future__ import annotations

import os

VARIABLE = "TIME_SCHEDULES"
_SWITCH = {"on": True, "off": False}


def time_schedule(cron: str) -> str | None:
    """`cron` (e.g. "@hourly"), or None when TIME_SCHEDULES is off."""
    value = os.environ.get(VARIABLE, "on").strip().lower() or "on"
    if value not in _SWITCH:
        raise ValueError(f"{VARIABLE}={value!r}: expected one of {sorted(_SWITCH)}")
    return cron if _SWITCH[value] else None
