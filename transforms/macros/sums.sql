{#- A sum of DOUBLEs taken in one fixed order (ascending values), so that the same rows always give the same bits:
    a plain sum depends on the order DuckDB's parallel scan and aggregation meet the rows in, and a ledger rebuilt
    from the same events must be identical (equal row hashes). Equal values may come in any order. -#}
{% macro fixed_order_sum(expr) -%}
  sum({{ expr }} order by {{ expr }})
{%- endmacro %}
