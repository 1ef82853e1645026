"""Carbon-aware placement of GPU jobs over a multi-region fleet (the coordinator level of DESIGN.md, Scheduling).

Two levels: the coordinator gives each pending job a cluster (region), a start hour and a power limit; each
cluster's agent packs the jobs starting now onto nodes and GPU devices with the FGD packer and may reject them
(rejected jobs go to their next-best candidate).

Public API
----------
Types (`scheduling.planner.types`): `Plan` (the contract: plan_time, policy, forecast_version, assignments,
explanations, unplaced), `PriorityWeights`, `PlanningProblem`.

Policies (`scheduling.planner.policies`): `PlacementPolicy` (one interface: `plan(problem, agents, pods, now_hour)
-> PlanOutcome`, `outcome.to_plan() -> Plan`), `make_policy(name)` for POLICY_NAMES: priority (ours),
performance-first, greedy-carbon, carbon-time, round-robin, random, optimum (the LP bound, `optimum.py`).

One plan for one hour::

    from scheduling.planner import plan_hour
    plan = plan_hour("2021-07-15T12:00Z", jobs)            # jobs: frame of scheduling.jobs.JOB_COLUMNS (pending)
    plan = plan_hour(t, jobs, policy="greedy-carbon", forecasts="naive", fleet=fleet, running=running)
    plan.assignments, plan.explanations, plan.unplaced

`HourlyPlanner` keeps the cluster agents (node state) between hours, as the simulator does::

    hp = HourlyPlanner(fleet, jobs, policy="priority", forecasts=provider)
    plan = hp.plan(now, pending_index)                   # binds the jobs that start now on their nodes
    hp.release_finished(now)

Simulator: `scheduling.simulator` (`build_scenario`, `simulate`, `evaluate`; `python -m scheduling evaluate`).
"""
from scheduling.planner.types import Plan, PlanningProblem, PriorityWeights  # noqa: F401
from scheduling.planner.policies import POLICY_NAMES, PlacementPolicy, make_policy  # noqa: F401
from scheduling.planner.session import HourlyPlanner, plan_hour  # noqa: F401

__all__ = ["Plan", "PlanningProblem", "PriorityWeights", "POLICY_NAMES", "PlacementPolicy", "make_policy",
           "HourlyPlanner", "plan_hour"]
