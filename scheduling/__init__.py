"""Carbon-aware planning of GPU jobs over a multi-region fleet, in layers (each imports only the ones below it):

cli            `python -m scheduling ...`
tasks          what the Airflow DAGs call
service        the hourly plan: warehouse inputs -> planner -> plan store + schedule files
evaluation     trace-driven simulator, bounds, ablations, FGD replay, predictor/power evaluation, reports
executors      one executor interface (replay, files), exactly-once dispatch log, job events
output         plan store (plan.*) and schedule files
queue          job intake: the job spec, job files, fleet checks, queue.* (states), the planner's job frame
explain        explanation texts
planning       problem, candidates, cluster agents, forecasts, LP, session, placement policies
models         performance/interference predictor, GPU power model, measured data
domain         fleet, jobs, plan types
packing        node/GPU packing (FGD and baselines), independent of the rest
"""
