"""One registry per concept (forecaster, packing policy, placement policy, explainer, connector): name -> factory.

An entry is either a callable or a lazy reference ``"package.module:attribute"`` that is imported on first use, so
that reading the names (DAG files do, while Airflow parses them) never imports numpy, torch or a solver. Presets
are keyword arguments bound to a name (e.g. ``priority-noprices`` = the priority policy with ``learn_prices=False``).
Every registry raises the same `UnknownNameError` naming the concept, the name and the known names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class Registry:
    """Names of one concept and how to build each, in registration order."""

    def __init__(self, concept: str):
        self.concept = concept
        self._entries: dict[str, tuple[str | Callable[..., Any], dict[str, Any]]] = {}

    def register(self, name: str, target: str | Callable[..., Any], **preset: Any) -> None:
        """Add `name`; `target` is a callable or "module:attribute"; `preset` kwargs are passed on every create."""
        if name in self._entries:
            raise ValueError(f"{self.concept} {name!r} is registered twice")
        self._entries[name] = (target, preset)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def check(self, name: str) -> str:
        """`name` if registered, else UnknownNameError."""
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.concept} {name!r}; known: {', '.join(self._entries)}")
        return name

    def factory(self, name: str) -> Callable[..., Any]:
        """The class or function registered under `name` (importing it on first use)."""
        target, _ = self._entries[self.check(name)]
        if isinstance(target, str):
            module_name, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module_name), attribute)
            self._entries[name] = (target, self._entries[name][1])
        return target

    def preset(self, name: str) -> dict[str, Any]:
        return dict(self._entries[self.check(name)][1])

    def create(self, name: str, /, **kwargs: Any) -> Any:
        """Build `name`: its factory called with the preset, overridden by `kwargs`."""
        factory = self.factory(name)
        return factory(**{**self.preset(name), **kwargs})
