-- One row per inference service and hour: what it served (output tokens, requests), the energy (PUE included) and
-- kgCO2e at the actual intensity of the zone of each cluster it ran in, gCO2e per 1k tokens, whether its latency
-- target held (no replica saturated, the latency at load within the target), against the static counterfactual:
-- provisioned for its peak in its home region at the default batch cap and power limit, serving the same demand,
-- valued at the home zone's actual intensity.
with usage as (
    select * from {{ ref('stg_services__usage') }}
),

valued as (
    select
        u.*,
        u.energy_kwh * u.pue as kwh,
        u.energy_kwh * u.pue * g.carbon_intensity_direct_gco2_per_kwh / 1000.0 as kgco2e,
        u.static_kwh * s.carbon_intensity_direct_gco2_per_kwh / 1000.0 as static_kgco2e,
        not u.saturated and u.latency_ms <= u.latency_slo_ms as slo_met,
        not u.static_saturated and u.static_latency_ms <= u.latency_slo_ms as static_slo_met,
        g.carbon_intensity_direct_gco2_per_kwh is null as missing_intensity
    from usage as u
    left join {{ ref('grid_hourly') }} as g
        on g.region = u.zone and g.hour_utc = u.hour_utc
    left join {{ ref('grid_hourly') }} as s
        on s.region = u.static_zone and s.hour_utc = u.hour_utc
)

select
    service,
    any_value(tenant) as tenant,
    any_value(service_id) as service_id,
    hour_utc,
    cast({{ as_utc_naive('hour_utc') }} as date) as day,
    string_agg(cluster, '+' order by cluster) as clusters,
    sum(replicas) as replicas,
    sum(gpus) as gpus,
    sum(requests) as requests,
    sum(demand_tokens_per_s) as demand_tokens_per_s,
    sum(tokens) as tokens,
    {{ fixed_order_sum('kwh') }} as kwh,
    {{ fixed_order_sum('kgco2e') }} as kgco2e,
    1e6 * {{ fixed_order_sum('kgco2e') }} / nullif(sum(tokens), 0) as g_per_1k_tokens,
    bool_and(slo_met) as slo_met,
    max(latency_ms) as latency_ms,
    any_value(latency_slo_ms) as latency_slo_ms,
    any_value(static_cluster) as static_cluster,
    any_value(static_gpus) as static_gpus,
    sum(static_tokens) as static_tokens,
    {{ fixed_order_sum('static_kgco2e') }} as static_kgco2e,
    1e6 * {{ fixed_order_sum('static_kgco2e') }} / nullif(sum(static_tokens), 0) as static_g_per_1k_tokens,
    bool_and(static_slo_met) as static_slo_met,
    bool_or(missing_intensity) as missing_intensity
from valued
group by service, hour_utc
