{#- Cluster-trace helpers. -#}

{#- A GPU model constraint ('V100M16|V100M32|V100M32', NULL) as a canonical string: distinct models, sorted, joined
    by '|'; 'any' when there is no constraint. -#}
{% macro normalize_gpu_constraint(col) -%}
  coalesce(
    nullif(array_to_string(list_sort(list_distinct(list_filter(string_split(trim(coalesce({{ col }}, '')), '|'), x -> trim(x) <> ''))), '|'), ''),
    'any'
  )
{%- endmacro %}

{#- GPU class of a task: cpu_only (no GPU), gpu_share (part of one GPU), single_gpu (one whole GPU), multi_gpu. -#}
{% macro gpu_class(num_gpu, gpu_milli) -%}
  case
    when {{ num_gpu }} is null then 'unknown'
    when {{ num_gpu }} = 0 then 'cpu_only'
    when {{ num_gpu }} = 1 and coalesce({{ gpu_milli }}, 1000) < 1000 then 'gpu_share'
    when {{ num_gpu }} = 1 then 'single_gpu'
    else 'multi_gpu'
  end
{%- endmacro %}

{#- CPU request bucket in cores (upper bounds inclusive): <=2, 2-4, 4-8, 8-16, 16-32, >32. -#}
{% macro cpu_bucket(cpu_milli) -%}
  case
    when {{ cpu_milli }} is null then 'unknown'
    when {{ cpu_milli }} <= 2000 then 'le2'
    when {{ cpu_milli }} <= 4000 then '2-4'
    when {{ cpu_milli }} <= 8000 then '4-8'
    when {{ cpu_milli }} <= 16000 then '8-16'
    when {{ cpu_milli }} <= 32000 then '16-32'
    else 'gt32'
  end
{%- endmacro %}

{#- GPU share bucket of a GPU-sharing task (fraction of one GPU, upper bounds inclusive); 'whole' for whole GPUs,
    'none' for CPU-only tasks. -#}
{% macro gpu_share_bucket(num_gpu, gpu_milli) -%}
  case
    when {{ num_gpu }} is null then 'unknown'
    when {{ num_gpu }} = 0 then 'none'
    when {{ num_gpu }} > 1 or coalesce({{ gpu_milli }}, 1000) >= 1000 then 'whole'
    when {{ gpu_milli }} <= 250 then 'le0.25'
    when {{ gpu_milli }} <= 500 then '0.25-0.5'
    when {{ gpu_milli }} <= 750 then '0.5-0.75'
    else '0.75-1'
  end
{%- endmacro %}
