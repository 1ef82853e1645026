"""Plan time onto a cluster's wall clock: the `clock` setting of the `kubernetes` executor.

The planner replays its own hours (2021 in the demos) while a cluster runs on the wall clock, so the executor maps
between them explicitly and never reads the wall clock itself:

    wall = wall_origin + (plan - plan_origin) * scale        plan = plan_origin + (wall - wall_origin) / scale

Default (no setting): the identity, for a planner that runs live (`plan_origin = wall_origin`, `scale` 1). A demo
that replays 2021-07-15 from now on sets ``clock: {plan_origin: 2021-07-15T00:00Z, wall_origin: <start>}``; a
`scale` below 1 runs replayed hours faster (0.1: an hour of plan in six minutes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from common.timeutil import utc

_EPOCH = pd.Timestamp("1970-01-01T00:00Z")
KEYS = ("plan_origin", "wall_origin", "scale")


@dataclass(frozen=True)
class ClusterClock:
    plan_origin: pd.Timestamp = _EPOCH
    wall_origin: pd.Timestamp = _EPOCH
    scale: float = 1.0

    @classmethod
    def from_setting(cls, value: Mapping | None, where: str = "clock") -> ClusterClock:
        """The clock of a `clock` setting ({plan_origin, wall_origin, scale}); ValueError naming a bad key."""
        value = dict(value or {})
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: {', '.join(KEYS)}")
        if ("plan_origin" in value) != ("wall_origin" in value):
            raise ValueError(f"{where}: give plan_origin and wall_origin together")
        scale = float(value.get("scale", 1.0))
        if not scale > 0:
            raise ValueError(f"{where}.scale: must be > 0, got {value.get('scale')!r}")
        return cls(utc(value.get("plan_origin", _EPOCH)), utc(value.get("wall_origin", _EPOCH)), scale)

    def to_wall(self, plan_time) -> pd.Timestamp:
        return (self.wall_origin + (utc(plan_time) - self.plan_origin) * self.scale).floor("us")

    def to_plan(self, wall_time) -> pd.Timestamp:
        return (self.plan_origin + (utc(wall_time) - self.wall_origin) / self.scale).floor("us")
