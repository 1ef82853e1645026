-- GPU telemetry samples (nvidia-smi / DCGM logs; raw.gpu_telemetry, optional: an empty relation when no log was
-- ingested). energy_j = energy since the GPU's previous sample (measured counter difference or integrated power).
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
    _loaded_at as loaded_at
from source
