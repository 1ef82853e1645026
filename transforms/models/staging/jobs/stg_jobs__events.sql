-- Executors' job events (raw.job_events), typed; an empty relation until the loop has loaded any.
with source as (
    {{ optional_source('raw', 'job_events', {
        'tenant': 'varchar',
        'job_id': 'varchar',
        'planner_job_id': 'varchar',
        'event': 'varchar',
        'event_time': 'timestamptz',
        'executor': 'varchar',
        'executor_ref': 'varchar',
        'plan_id': 'varchar',
        'attempt': 'integer',
        'cluster': 'varchar',
        'node': 'varchar',
        'gpu_devices': 'varchar',
        'gpu_count': 'integer',
        'gpu_milli': 'integer',
        'power_limit_w': 'double',
        'energy_kwh': 'double',
        '_loaded_at': 'timestamptz',
    }) }}
)

select * from source
