"""Forecasters of carbon intensity and solar/wind generation behind one fit/predict interface."""
