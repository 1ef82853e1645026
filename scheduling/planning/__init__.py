"""Carbon-aware placement: a coordinator gives each pending job a cluster (region), a start hour and a power limit;
each cluster's agent packs the jobs starting now onto nodes and GPU devices and may reject them (rejected jobs go
to their next-best candidate). `session.HourlyPlanner` / `session.plan_hour` are the entry points; placement
policies live in `policies/` behind one interface and one registry."""
