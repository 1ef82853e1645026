-- GPU telemetry (raw.gpu_telemetry, optional: an empty relation when no log was ingested): node samples (nvidia-smi /
-- DCGM logs; energy_j = energy since the GPU's previous sample) and job meter readings (CodeCarbon / Zeus; energy_j =
-- the energy of the job's run in [window_start_utc, ts_utc], keyed to the planner job id job_key).
with source as (
    {{ optional_source('raw', 'gpu_telemetry', {
        'ts_utc': 'timestamptz',
        'host': 'varchar',
        'gpu_index': 'integer',
        'gpu_uuid': 'varchar',
        'gpu_model': 'varchar',
        'power_w': 'double',
        'sm_clock_mhz': 'double',
        'gpu_util_pct': 'double',
        'energy_j': 'double',
        'energy_source': 'varchar',
        'energy_counter_j': 'double',
        'power_limit_w': 'double',
        'temperature_c': 'double',
        'log_format': 'varchar',
        'source_tz': 'varchar',
        'job_key': 'varchar',
        'meter_run_id': 'varchar',
        'window_start_utc': 'timestamptz',
        'energy_scope': 'varchar',
        '_loaded_at': 'timestamptz',
    }) }}
)

select
    ts_utc,
    {{ utc_hour('ts_utc') }} as hour_utc,
    host,
    gpu_index,
    gpu_uuid,
    gpu_model,
    power_w,
    sm_clock_mhz,
    gpu_util_pct,
    energy_j,
    energy_source,
    energy_counter_j,
    power_limit_w,
    temperature_c,
    log_format,
    source_tz,
    job_key,
    meter_run_id,
    window_start_utc,
    coalesce(energy_scope, 'gpu') as energy_scope,
    _loaded_at as loaded_at
from source
