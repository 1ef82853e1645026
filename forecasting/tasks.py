"""What the forecast DAGs call: Param validation, then training or issuing forecasts; JSON-able results."""

from __future__ import annotations

import logging

from common.timeutil import parse_time
from forecasting import service

log = logging.getLogger(__name__)

TARGETS = ("carbon_intensity", "solar", "wind")


def _regions_known() -> list[str]:
    return ["CISO", "ERCO", "PJM", "ISNE", "MISO", "DE", "ES", "NL", "PL", "SE", "GB"]


def validate(params: dict, interval_end) -> dict:
    """Check the Params before any work; the issue/training time defaults to the run's data interval end."""
    regions = list(params.get("regions") or service.DEFAULT_REGIONS)
    unknown = sorted(set(regions) - set(_regions_known()))
    if unknown:
        raise ValueError(f"unknown region(s) {unknown}; choose from {_regions_known()}")
    targets = list(params.get("targets") or ["carbon_intensity"])
    bad = sorted(set(targets) - set(TARGETS))
    if bad:
        raise ValueError(f"unknown target(s) {bad}; choose from {list(TARGETS)}")
    out = {
        "regions": regions,
        "targets": targets,
        "models": list(params.get("models") or []) or None,
        "tiny": bool(params.get("tiny", False)),
    }
    if "as_of" in params:
        out["as_of"] = parse_time(params["as_of"] or interval_end, "as_of").isoformat()
        horizon = int(params.get("horizon", 96))
        if not 1 <= horizon <= 96:
            raise ValueError(f"horizon must be 1–96 hours, got {horizon}")
        out["horizon"] = horizon
    if "train_end" in params:
        out["train_end"] = parse_time(params["train_end"] or interval_end, "train_end").isoformat()
        out["budget_s"] = float(params.get("budget_s", 840))
    return out


def train(choice: dict) -> list[dict]:
    """Train and register the chosen models (`validate`'s output); fails when every model failed."""
    results = service.train(
        models=choice["models"],
        targets=choice["targets"],
        regions=choice["regions"],
        train_end=choice["train_end"],
        budget_s=choice["budget_s"],
        tiny=choice["tiny"],
        progress=log.info,
    )
    rows = [{"model": r.model, "target": r.target, "status": r.status} for r in results]
    for row in rows:
        log.info("trained %s/%s: %s", row["model"], row["target"], row["status"])
    if rows and all(r["status"] == "failed" for r in rows):
        raise RuntimeError(f"every model failed to train: {rows}")
    return rows


def predict(choice: dict) -> dict:
    """Issue and store the chosen forecasts (`validate`'s output); a summary of the rows written."""
    rows, results = service.predict(
        choice["as_of"],
        horizon=choice["horizon"],
        regions=choice["regions"],
        targets=choice["targets"],
        models=choice["models"],
        bootstrap_tiny=choice["tiny"],
    )
    fallback = int(rows["is_fallback"].sum()) if len(rows) and "is_fallback" in rows else 0
    log.info("issued %d forecast rows at %s (%d fallback rows)", len(rows), choice["as_of"], fallback)
    return {"as_of": choice["as_of"], "rows": int(len(rows)), "fallback_rows": fallback}
