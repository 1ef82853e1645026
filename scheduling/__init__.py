"""Scheduling: cluster/GPU model, packing policies (FGD + baselines), predictor, power model, planner, simulator."""
