"""Plan time onto an executor's wall clock and back: the explicit mapping a live executor uses.

Plans are made in plan time (a replayed 2021 hour, or now); a live scheduler such as Slurm runs on the wall clock.

    clock = PlanClock(plan_origin="2021-07-15T00:00Z", wall_origin="2026-11-26T06:00Z", seconds_per_hour=60)
    clock.to_wall("2021-07-15T02:00Z")      # 2026-11-26T06:02Z: plan hour T0 -> wall origin, 1 plan h -> 60 s
    clock.to_plan(wall_time)                # the inverse, for the times the executor reports

Without origins the mapping is the identity (plan time IS the wall time: a planner running live). The mapping never
reads the wall clock itself, so planning stays a function of its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from common.timeutil import utc

HOUR_S = 3600.0
SETTING_KEYS = ("plan_origin", "wall_origin", "seconds_per_hour")


@dataclass(frozen=True)
class PlanClock:
    """wall = wall_origin + (plan - plan_origin) x seconds_per_hour / 3600; identity when no origin is given."""

    plan_origin: pd.Timestamp | None = None
    wall_origin: pd.Timestamp | None = None
    seconds_per_hour: float = HOUR_S

    @classmethod
    def from_settings(cls, plan_origin=None, wall_origin=None, seconds_per_hour=None) -> PlanClock:
        if (plan_origin is None) != (wall_origin is None):
            raise ValueError("settings 'plan_origin' and 'wall_origin' go together (both, or neither for identity)")
        scale = HOUR_S if seconds_per_hour is None else float(seconds_per_hour)
        if not scale > 0:
            raise ValueError(f"setting 'seconds_per_hour' must be > 0, got {seconds_per_hour!r}")
        if plan_origin is None:
            return cls(seconds_per_hour=scale)
        return cls(utc(plan_origin), utc(wall_origin), scale)

    @classmethod
    def from_setting(cls, value: Mapping | None, where: str = "clock") -> PlanClock:
        """The clock of a nested `clock: {plan_origin, wall_origin, seconds_per_hour}` setting (None: identity);
        ValueError naming `where` and the bad key."""
        value = dict(value or {})
        unknown = sorted(set(value) - set(SETTING_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: {', '.join(SETTING_KEYS)}")
        try:
            return cls.from_settings(**value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @property
    def ratio(self) -> float:
        """Wall seconds per plan second."""
        return self.seconds_per_hour / HOUR_S

    def to_wall(self, plan_time) -> pd.Timestamp:
        t = utc(plan_time)
        if self.plan_origin is None:
            return t
        return self.wall_origin + (t - self.plan_origin) * self.ratio

    def to_plan(self, wall_time) -> pd.Timestamp:
        t = utc(wall_time)
        if self.plan_origin is None:
            return t
        return self.plan_origin + (t - self.wall_origin) / self.ratio

    def wall_seconds(self, plan_duration: pd.Timedelta) -> float:
        """A plan-time duration in wall seconds."""
        return pd.Timedelta(plan_duration).total_seconds() * (self.ratio if self.plan_origin is not None else 1.0)

    def plan_hours(self, wall_seconds: float) -> float:
        """A wall-clock duration in plan hours."""
        return float(wall_seconds) / (self.ratio if self.plan_origin is not None else 1.0) / HOUR_S
