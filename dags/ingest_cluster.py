"""Airflow DAG: ingest cluster traces into raw.*: openb pods (24 variants) and nodes, Alibaba PAI machine specs,
Philly durations.

Trigger by hand; Params choose sources and the data folder. Updates the Asset `warehouse://raw/cluster`.
"""

from dagutils.assets import RAW_CLUSTER
from dagutils.ingest_dag import file_ingest_dag

dag = file_ingest_dag("ingest_cluster", {"cluster": RAW_CLUSTER}, __doc__)
