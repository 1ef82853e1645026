{#-
  Select `columns` (a dict name -> SQL type) from source(source_name, table_name) when that table exists, else an
  empty relation with the same typed columns. For tables that only some runs create (live connectors, the operating
  loop, stored plans). A column the table does not have (yet) reads as NULL. The source() call happens at parse
  time too, so lineage and `dbt source freshness` still see the table.
-#}
{% macro optional_source(source_name, table_name, columns) -%}
  {%- set rel = source(source_name, table_name) -%}
  {%- set found = none -%}
  {%- if execute -%}
    {%- set found = adapter.get_relation(database=rel.database, schema=rel.schema, identifier=rel.identifier) -%}
  {%- endif -%}
  {%- if found is not none -%}
    {%- set present = adapter.get_columns_in_relation(found) | map(attribute='name') | map('lower') | list -%}
    select
    {%- for name, type in columns.items() %}
      {%- if name | lower in present %}
        cast({{ adapter.quote(name) }} as {{ type }}) as {{ adapter.quote(name) }}{{ "," if not loop.last }}
      {%- else %}
        cast(null as {{ type }}) as {{ adapter.quote(name) }}{{ "," if not loop.last }}
      {%- endif %}
    {%- endfor %}
    from {{ rel }}
  {%- else -%}
    select
    {%- for name, type in columns.items() %}
        cast(null as {{ type }}) as {{ adapter.quote(name) }}{{ "," if not loop.last }}
    {%- endfor %}
    where false
  {%- endif -%}
{%- endmacro %}
