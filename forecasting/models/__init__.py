"""The forecasters behind `forecasting.base.Forecaster`, one per module; `registry.make_model` builds them by name.

`prophet_model.py` and `tft_model.py` keep their names: registered artifacts record the module of their class.
"""
