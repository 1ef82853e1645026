"""The explainer registry: `make_explainer(name)`; the default comes from $PLAN_EXPLAINER, else `template`."""

from __future__ import annotations

import os

from common.registry import Registry
from scheduling.explain.chat import ChatExplainer
from scheduling.explain.template import TemplateExplainer

EXPLAINERS = Registry("explainer")
EXPLAINERS.register("template", TemplateExplainer)
EXPLAINERS.register("chat", ChatExplainer.from_config)  # falls back to the template when no endpoint is configured


def make_explainer(name: str | None = None):
    """An explainer by registered name; None: $PLAN_EXPLAINER, else "template" (case-insensitive)."""
    name = (name or os.environ.get("PLAN_EXPLAINER") or "template").strip().lower()
    return EXPLAINERS.create(name)
