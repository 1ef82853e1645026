{#- Time helpers that do not depend on the session time zone. -#}

{#- The start of the UTC hour holding `col` (TIMESTAMPTZ), as TIMESTAMPTZ. time_bucket buckets a TIMESTAMPTZ in
    UTC by default, whatever the session's TimeZone. -#}
{% macro utc_hour(col) -%}
  time_bucket(interval 1 hour, cast({{ col }} as timestamptz))
{%- endmacro %}

{#- `col` (TIMESTAMPTZ) as a naive TIMESTAMP in UTC, for calendar parts. -#}
{% macro as_utc_naive(col) -%}
  timezone('UTC', cast({{ col }} as timestamptz))
{%- endmacro %}
