{#-
  Select `columns` (a dict name -> SQL type) from source(source_name, table_name) when that table exists, else an
  empty relation with the same typed columns. For tables that only the live connectors create. The source() call
  happens at parse time too, so lineage and `dbt source freshness` still see the table.
-#}
{% macro optional_source(source_name, table_name, columns) -%}
  {%- set rel = source(source_name, table_name) -%}
  {%- set found = none -%}
  {%- if execute -%}
    {%- set found = adapter.get_relation(database=rel.database, schema=rel.schema, identifier=rel.identifier) -%}
  {%- endif -%}
  {%- if found is not none -%}
    select
    {%- for name, type in columns.items() %}
        cast({{ adapter.quote(name) }} as {{ type }}) as {{ adapter.quote(name) }}{{ "," if not loop.last }}
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
