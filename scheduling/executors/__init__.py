"""Executors: what runs the dispatched part of a plan, behind one interface, and what it reports back.

base          the `Executor` interface, event/running/record frames, the plan-time clock
items         what a dispatch carries: the plan's assignments that start now + each job's payload
registry      `make_executor(kind, settings)`: replay (the embedded default), files, kubernetes, slurm
dispatch_log  exactly-once dispatch through `plan.dispatch_log` (intent -> sent | failed)
replay        runs jobs in replayed time with true run times and failures (`executor.replay_runs`)
files         hands schedule files (JSON, Kubernetes, Slurm) to another system
k8s           gated Pods on Kubernetes clusters (k8s_pods: the Pod, k8s_api: the client calls,
              k8s_sharing: GPU-sharing requests)
slurm         submits to a real Slurm (sbatch --begin) and reads it back (squeue, jobcomp); slurm_job: one
              submission's name, comment, options and script; slurm_cli: Slurm's clients as calls
clock         plan time onto a live executor's wall clock and back
events        `raw.job_events`: what executors report, loaded per window
"""
