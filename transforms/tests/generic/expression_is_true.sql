{#- Every row satisfies the boolean SQL `expression` (optionally only rows matching `where`). -#}
{% test expression_is_true(model, expression) %}
select *
from {{ model }}
where not coalesce(({{ expression }}), false)
{% endtest %}
