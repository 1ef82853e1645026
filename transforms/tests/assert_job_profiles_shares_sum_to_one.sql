-- Job-class shares add up to 1 within each trace variant (jobs and GPU demand).
select trace, variant, sum(share_of_variant) as jobs, sum(share_of_variant_gpu_demand) as gpu_demand
from {{ ref('job_profiles') }}
group by trace, variant
having abs(sum(share_of_variant) - 1) > 1e-9
    or (sum(share_of_variant_gpu_demand) is not null and abs(sum(share_of_variant_gpu_demand) - 1) > 1e-9)
