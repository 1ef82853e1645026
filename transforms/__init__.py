"""The dbt project (dbt_project.yml, models/) and its Python side: runner.py (dbt under the warehouse lock) and
cosmos_config.py (the Airflow/Cosmos configuration of dags/transform.py)."""
