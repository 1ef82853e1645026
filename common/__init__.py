"""Helpers shared by `forecasting` and `scheduling`: UTC time, deterministic JSON and the model registry.

This package sits between `warehouse` and the two modelling packages: it may import `warehouse`, and only
`forecasting`, `scheduling` and the entry points above them import it.
"""
