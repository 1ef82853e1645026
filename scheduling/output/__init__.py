"""Outputs of a plan: the plan store (DuckDB `plan.*`) and the schedule files handed to executors."""
