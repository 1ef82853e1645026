"""`carbon-time`: FIFO; maximise carbon saved per hour of waiting, (C_ref - C) / (wait + 1) (GAIA's Carbon-Time,
extended to regions)."""

from __future__ import annotations

import numpy as np

from scheduling.planning.policies.base import BIG, SequentialPolicy


class CarbonTime(SequentialPolicy):
    """Carbon saved per unit of waiting: among candidates, maximise (C_ref - C) / (wait + 1), where C_ref is
    the cheapest candidate at the earliest feasible start and wait the hours after it (GAIA's Carbon-Time,
    extended to regions). A candidate saving nothing scores its plain cost behind every saving one."""

    name = "carbon-time"
    description = "FIFO, maximise carbon saved per hour of waiting"

    def score(self, problem, j, view, evaluator):
        feas = view.feasible
        if not feas.any():
            return view.cost
        s_min = int(np.nonzero(feas.any(axis=(0, 2)))[0][0])
        ref = np.where(feas[:, s_min, :], view.cost[:, s_min, :], np.inf).min()
        wait = np.maximum(view.s - s_min, 0)
        saved = ref - view.cost
        rate = saved / (wait + 1.0)
        return np.where(saved > 1e-12, -rate, BIG + view.cost)
