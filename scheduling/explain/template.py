"""`template`: the deterministic explainer (no I/O): the decision, its carbon against the alternatives and the
counterfactuals, the binding constraints and the power limit, in fixed sentences."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from common.timeutil import utc


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(f):
        return "n/a"
    return f"{f:.{digits}f}"


def _kg(value: Any) -> str:
    text = _num(value, 3)
    return text if text == "n/a" else f"{text} kgCO2e"


def _time(value: Any) -> str:
    if value is None or value == "":
        return "n/a"
    try:
        ts = pd.Timestamp(value)
    except (TypeError, ValueError):
        return str(value)
    if ts is pd.NaT:
        return "n/a"
    return utc(ts).strftime("%Y-%m-%d %H:%M UTC")


def _place(entry: dict) -> str:
    region = entry.get("region") or "n/a"
    cluster = entry.get("cluster")
    return f"{region} ({cluster})" if cluster else str(region)


def _delta(base: Any, chosen: Any) -> str:
    try:
        b, c = float(base), float(chosen)
    except (TypeError, ValueError):
        return ""
    if math.isnan(b) or math.isnan(c):
        return ""
    diff = b - c
    pct = f", {100.0 * diff / b:.1f} %" if b > 0 else ""
    word = "saves" if diff >= 0 else "costs"
    return f" (the plan {word} {abs(diff):.3f} kgCO2e{pct})"


class TemplateExplainer:
    """The card text written deterministically from the record (same record -> same text)."""

    def explain(self, record: dict) -> str:
        r = record or {}
        job = r.get("job_id", "n/a")
        lines = []
        weights = r.get("weights")
        if isinstance(weights, dict) and weights:
            wtext = ", ".join(f"{k} {_num(v)}" for k, v in sorted(weights.items()))
        elif isinstance(weights, (list, tuple)) and weights:
            wtext = "/".join(_num(v) for v in weights)
        else:
            wtext = "n/a"
        lines.append(
            f"Job {job}: priority {_num(r.get('priority'), 3)} from urgency {_num(r.get('urgency'), 3)}, "
            f"flexibility {_num(r.get('flexibility'), 3)}, opportunity {_num(r.get('opportunity'), 3)} "
            f"(weights: {wtext})."
        )
        chosen = r.get("chosen") or {}
        if chosen:
            lines.append(
                f"Chosen: start {_time(chosen.get('start_time'))} in {_place(chosen)}, "
                f"expected {_kg(chosen.get('kgco2e'))}"
                + (
                    " -- on a standby node kept for whole-node jobs: due now, no other node free"
                    if chosen.get("standby_node")
                    else ""
                )
                + "."
            )
        else:
            lines.append("Chosen: not placed in this plan.")
        alternatives = list(r.get("alternatives") or [])[:5]
        if alternatives:
            lines.append("Alternatives considered (top five):")
            for i, alt in enumerate(alternatives, 1):
                lines.append(f"  {i}. {_place(alt)} at {_time(alt.get('start_time'))}: {_kg(alt.get('kgco2e'))}")
        else:
            lines.append("Alternatives considered: none.")
        cf = r.get("counterfactuals") or {}
        ck = chosen.get("kgco2e")
        lines.append(
            "Counterfactuals: run now "
            + _kg(cf.get("run_now_kgco2e"))
            + _delta(cf.get("run_now_kgco2e"), ck)
            + "; greedy carbon "
            + _kg(cf.get("greedy_carbon_kgco2e"))
            + _delta(cf.get("greedy_carbon_kgco2e"), ck)
            + "; optimum "
            + (_kg(cf.get("optimum_kgco2e")) if cf.get("optimum_kgco2e") is not None else "not computed")
            + "."
        )
        binding = r.get("binding_constraints") or []
        if isinstance(binding, str):
            binding = [binding]
        lines.append("Binding constraints: " + (", ".join(str(b) for b in binding) if binding else "none") + ".")
        lines.append(f"Forecast: {r.get('forecast_version') or 'n/a'}.")
        power = r.get("power") or {}
        if power.get("limit_w") is not None:
            lines.append(
                f"Power: GPU limit {_num(power.get('limit_w'), 0)} W, saving {_kg(power.get('saving_kgco2e'))}."
            )
        else:
            lines.append("Power: default limit.")
        return "\n".join(lines)
