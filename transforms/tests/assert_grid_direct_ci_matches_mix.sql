-- The direct CI of every file-sourced grid hour equals the CI recomputed from that hour's mix with the CarbonCast
-- direct factors (SOURCE.md: the EnsembleCI files reproduce exactly; DE is recomputed at ingestion, GB too). This
-- guards the DE recomputation, the fuel mapping and the ÷4 scaling (a ratio, so it must not move the CI).
-- Tolerance 0.01 gCO2/kWh (the files round CI to 2 decimals).
select
    h.region,
    h.hour_utc,
    h.carbon_intensity_direct_gco2_per_kwh,
    m.carbon_intensity_direct_gco2_per_kwh as from_mix
from {{ ref('grid_hourly') }} as h
inner join {{ ref('int_grid__ci_from_mix') }} as m
    on m.region = h.region and m.hour_utc = h.hour_utc
where h.ci_data_source in ('ensembleci', 'lets_wait_awhile')
  and h.generation_data_source = h.ci_data_source
  and abs(h.carbon_intensity_direct_gco2_per_kwh - m.carbon_intensity_direct_gco2_per_kwh) > 0.01
