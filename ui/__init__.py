"""The Carbon pages inside the Airflow UI: the ledger, the current plan and every decision, rendered server-side from
the warehouse (read-only) by a FastAPI app that an Airflow plugin (plugins/carbon.py) mounts under /carbon."""
