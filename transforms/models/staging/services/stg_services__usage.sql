-- What the executors' inference services served (raw.service_usage), one row per service, cluster and hour:
-- requests, output tokens, GPU energy (no PUE), the latency at the load each replica carried, and the static
-- counterfactual's hour (home region, provisioned for the peak, default batch cap and power limit; its kWh with
-- PUE). Empty until the loop has served a service.
with source as (
    {{ optional_source('raw', 'service_usage', {
        'service': 'varchar',
        'tenant': 'varchar',
        'service_id': 'varchar',
        'hour_utc': 'timestamptz',
        'executor': 'varchar',
        'cluster': 'varchar',
        'plan_id': 'varchar',
        'replicas': 'integer',
        'gpus': 'integer',
        'batch_cap': 'integer',
        'requests': 'double',
        'demand_tokens_per_s': 'double',
        'tokens': 'double',
        'energy_kwh': 'double',
        'latency_ms': 'double',
        'saturated': 'boolean',
        'region': 'varchar',
        'zone': 'varchar',
        'pue': 'double',
        'latency_slo_ms': 'double',
        'static_cluster': 'varchar',
        'static_zone': 'varchar',
        'static_gpus': 'integer',
        'static_tokens': 'double',
        'static_kwh': 'double',
        'static_latency_ms': 'double',
        'static_saturated': 'boolean',
    }) }}
)

select * from source
