"""The forecasters behind `forecasting.base.Forecaster`, one per module; `registry.make_model` builds them by name."""
