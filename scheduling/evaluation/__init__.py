"""Evaluation: trace-driven simulator, bounds, ablations, FGD replay, predictor and power-model evaluation, reports."""
