"""Fleet, jobs and plan types: what the rest of the package talks about."""
