{#- Grid helpers shared by the grid models. -#}

{#- SQL list literal of the live-feed data sources (var live_data_sources). -#}
{% macro live_data_sources_sql() -%}
  ({%- for s in var('live_data_sources') -%}'{{ s }}'{{ ", " if not loop.last }}{%- endfor -%})
{%- endmacro %}

{#- Rank of a data source when several cover the same region-hour: files first (1), then live feeds in the order of
    var live_data_sources. Lower wins. -#}
{% macro data_source_rank(column) -%}
  case {{ column }}
    when 'ensembleci' then 1
    when 'lets_wait_awhile' then 1
    {%- for s in var('live_data_sources') %}
    when '{{ s }}' then {{ loop.index + 1 }}
    {%- endfor %}
    else 99
  end
{%- endmacro %}

{#- Renewable MW from the wide <fuel>_mw columns: solar + wind + hydro + biomass + geothermal (var renewable_fuels),
    NULL fuels count as 0, negative net generation counts as 0. -#}
{% macro renewable_mw(prefix='') -%}
  ({%- for f in var('renewable_fuels') -%}greatest(coalesce({{ prefix }}{{ f }}_mw, 0), 0){{ " + " if not loop.last }}{%- endfor -%})
{%- endmacro %}

{#- Aggregate: the set of quality codes in `col` over the group's rows (each value NULL, one code, or codes joined
    with ';'), as distinct codes sorted and joined with ';'; NULL when there are none. -#}
{% macro agg_flag_set(col) -%}
  nullif(array_to_string(list_sort(list_distinct(list_filter(
    flatten(list(string_split(coalesce({{ col }}, ''), ';'))), x -> x <> ''
  ))), ';'), '')
{%- endmacro %}
