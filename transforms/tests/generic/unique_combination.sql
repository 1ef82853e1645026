{#- No two rows share the same values of `combination` (a list of columns). dbt-core has no packages here
    (no dbt_utils), hence this small generic test. -#}
{% test unique_combination(model, combination) %}
select {{ combination | join(', ') }}, count(*) as n_rows
from {{ model }}
group by {{ combination | join(', ') }}
having count(*) > 1
{% endtest %}
