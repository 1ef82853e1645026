"""Judging forecasts: metrics, rolling-origin backtests, the results document and plots. May use any model;
no model imports this package."""
