-- Per measurement set x GPU type x placement x job type (x scale factor): isolated throughput (partner NULL), and per
-- co-located pair each job's throughput normalized by its isolated throughput. One row per job perspective: a pair
-- (A, B) gives a row for A (partner B) and one for B (partner A). Semantics: gpu_throughput.yml.
with isolated as (
    select * from {{ ref('stg_interference__gavel_isolated') }}
),

colocated as (
    select * from {{ ref('stg_interference__gavel_colocated') }}
),

job_types as (
    select job_type, any_value(model_family) as model_family, any_value(batch_size) as batch_size
    from isolated
    group by job_type
),

isolated_rows as (
    select
        measurement_set,
        gpu_type,
        consolidated,
        job_type,
        model_family,
        batch_size,
        scale_factor,
        cast(null as varchar) as partner_job_type,
        cast(null as integer) as partner_scale_factor,
        steps_per_s,
        steps_per_s as isolated_steps_per_s,
        case when steps_per_s > 0 then 1.0 else 0.0 end as normalized_throughput,
        steps_per_s > 0 as feasible,
        cast(null as double) as partner_normalized_throughput
    from isolated
),

pairs as (
    select
        c.*,
        c.feasible
            and c.steps_per_s_a_colocated > 0
            and c.steps_per_s_a_isolated > 0
            and c.steps_per_s_b_isolated > 0 as pair_feasible
    from colocated as c
),

pair_rows as (
    select
        p.measurement_set,
        p.gpu_type,
        p.consolidated,
        p.job_a as job_type,
        coalesce(j.model_family, regexp_extract(p.job_a, '^(.*?) \(batch size \d+\)$', 1), p.job_a) as model_family,
        coalesce(j.batch_size, try_cast(nullif(regexp_extract(p.job_a, '\(batch size (\d+)\)$', 1), '') as integer))
            as batch_size,
        p.scale_factor_a as scale_factor,
        p.job_b as partner_job_type,
        p.scale_factor_b as partner_scale_factor,
        case when p.pair_feasible then p.steps_per_s_a_colocated else 0.0 end as steps_per_s,
        p.steps_per_s_a_isolated as isolated_steps_per_s,
        case when p.pair_feasible then p.steps_per_s_a_colocated / p.steps_per_s_a_isolated else 0.0 end
            as normalized_throughput,
        p.pair_feasible as feasible,
        case when p.pair_feasible then p.steps_per_s_b_colocated / p.steps_per_s_b_isolated end
            as partner_normalized_throughput
    from pairs as p
    left join job_types as j on j.job_type = p.job_a
)

select
    *,
    -- both jobs' normalized throughput together: > 1 means sharing the GPU beats running them one after the other
    normalized_throughput + partner_normalized_throughput as combined_normalized_throughput
from (
    select * from isolated_rows
    union all
    select * from pair_rows
)
