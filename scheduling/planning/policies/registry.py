"""The placement-policy registry: every caller (hourly plan, DAG Params, simulator, CLI) names policies from here.

Import-light on purpose (no numpy): DAG files read the names while Airflow parses them; a policy's module is
imported the first time `make_policy` builds it.
"""

from __future__ import annotations

from common.registry import Registry

_PACKAGE = "scheduling.planning.policies"

POLICIES = Registry("placement policy")
POLICIES.register("priority", f"{_PACKAGE}.priority:PriorityCarbon")
POLICIES.register("rolling-lp", f"{_PACKAGE}.rolling_lp:RollingLP")
POLICIES.register("performance-first", f"{_PACKAGE}.performance_first:PerformanceFirst")
POLICIES.register("greedy-carbon", f"{_PACKAGE}.greedy_carbon:GreedyCarbon")
POLICIES.register("carbon-time", f"{_PACKAGE}.carbon_time:CarbonTime")
POLICIES.register("round-robin", f"{_PACKAGE}.round_robin:RoundRobin")
POLICIES.register("random", f"{_PACKAGE}.random_placement:RandomPlacement")
POLICIES.register("optimum", f"{_PACKAGE}.optimum:OptimumPolicy")
# the priority formula alone, without learned capacity prices (an evaluation ablation)
POLICIES.register("priority-noprices", f"{_PACKAGE}.priority:PriorityCarbon", learn_prices=False)

# The policies an evaluation runs by default (report order), and what the hourly plan and the DAG Params accept.
ONLINE_POLICIES = (
    "priority",
    "rolling-lp",
    "performance-first",
    "greedy-carbon",
    "carbon-time",
    "round-robin",
    "random",
)
POLICY_NAMES = ONLINE_POLICIES + ("optimum",)
# The hourly plan's default: on all four evaluated scenarios (two periods x two loads) it emits less carbon and meets
# more deadlines than `priority` (docs/results/planner/results.md).
DEFAULT_POLICY = "rolling-lp"


def make_policy(name: str, *, seed: int = 0, weights=None, learn_prices: bool = True):
    """A fresh `PlacementPolicy` by registered name; `seed`, `weights` and `learn_prices` go to the policies
    that take them (a name's preset wins, e.g. `priority-noprices` never learns prices)."""
    cls = POLICIES.factory(name)
    options = {"seed": seed, "weights": weights, "learn_prices": learn_prices, **POLICIES.preset(name)}
    return cls.create(**options)
