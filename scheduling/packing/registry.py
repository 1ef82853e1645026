"""The packing policies by name: one ``common.registry.Registry`` mapping each policy's ``name`` to its class.

Names are matched case-insensitively, ignoring ``-`` and ``_`` (``"Best-Fit"`` is ``bestfit``). They are registered
in the order of the FGD paper's figures, the baselines first and FGD last; ``POLICY_NAMES`` keeps that order and
``DISPLAY_NAMES`` gives each policy's label in tables and plots.
"""

from __future__ import annotations

from common.registry import Registry, UnknownNameError
from scheduling.packing.base import PackingPolicy
from scheduling.packing.policies import FGD, BestFit, DotProd, GpuClustering, GpuPacking, RandomFit
from scheduling.packing.workload import TargetWorkload

POLICIES = Registry("packing policy")
for _cls in (RandomFit, DotProd, GpuClustering, GpuPacking, BestFit, FGD):
    POLICIES.register(_cls.name, _cls)
del _cls

POLICY_NAMES: tuple[str, ...] = POLICIES.names
DISPLAY_NAMES: dict[str, str] = {name: POLICIES.factory(name).display_name for name in POLICY_NAMES}


def policy_key(name: str) -> str:
    """The registry key of a policy name as a user may write it (case, ``-`` and ``_`` ignored)."""
    return name.lower().replace("-", "").replace("_", "")


def make_policy(name: str, workload: TargetWorkload | None = None, seed: int | None = None) -> PackingPolicy:
    """A fresh policy by name (see ``POLICY_NAMES``). FGD needs the target ``workload`` (ValueError without it);
    Random takes a ``seed``; the other options are ignored. An unknown name raises ``UnknownNameError`` (a
    ``ValueError`` and ``KeyError``) listing the known names."""
    return POLICIES.factory(policy_key(name)).create(workload=workload, seed=seed)


__all__ = ["DISPLAY_NAMES", "POLICIES", "POLICY_NAMES", "UnknownNameError", "make_policy", "policy_key"]
