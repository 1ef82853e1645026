"""Airflow DAG: ingest GPU measurements into raw.*: energy (Zeus sweeps/profiles, ML.ENERGY v2/v3, AcmeTrace,
telemetry logs: nvidia-smi, DCGM, and the jobs' own CodeCarbon and Zeus meters) and interference (Gavel isolated
and co-located throughputs).

Trigger by hand; Params choose sources and the data folder. Updates `warehouse://raw/energy` and
`warehouse://raw/interference`.
"""

from dagutils.assets import RAW_ENERGY, RAW_INTERFERENCE
from dagutils.ingest_dag import file_ingest_dag

dag = file_ingest_dag("ingest_energy", {"energy": RAW_ENERGY, "interference": RAW_INTERFERENCE}, __doc__)
