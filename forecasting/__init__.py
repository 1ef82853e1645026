"""Forecasters of carbon intensity and solar/wind generation behind one fit/predict interface.

Layers, each importing only those below it: `cli` (the command line) > `tasks` (what the DAGs call) > `service`
(train, register, predict with fallbacks) > `evaluation` (metrics, backtests, results, plots) > `models` (the
forecasters and `models.registry.make_model`) > `store` (forecast.forecasts) and `data` (grid frames, published
forecasts, masking, issue times) > `base` (the Forecaster interface). Model versions live in `warehouse.model_registry`.
"""
