#!/bin/sh
# Applies a running job's power-limit changes to its GPUs: started by prolog-power-limit.sh (as root, in the
# background) for each job the carbon-aware planner runs, with the job id, its GPUs (SLURM_JOB_GPUS), the limit the
# prolog set and the job's restart count. Every POWER_LIMIT_POLL_S seconds (default 60) it reads the job
# (scontrol show job) and, when the comment's power_limit_w=<W> differs from the limit it last set, runs
# `nvidia-smi -i <GPUs> -pl <W>` (GPU_TOOL replaces nvidia-smi). It exits once the job no longer runs here: ended,
# requeued (its restart count changed) or forgotten by Slurm. While slurmctld cannot be reached it keeps polling.
# It never touches the job itself: a failed GPU call is logged, and the job runs on at the limit it had.
exec </dev/null >/dev/null 2>&1 # tells the prolog it runs detached (see there)
job=$1 gpus=$2 applied=$3 restarts=${4:-0}
[ -n "$job" ] && [ -n "$gpus" ] || exit 0
interval=${POWER_LIMIT_POLL_S:-60}
tool=${GPU_TOOL:-nvidia-smi}
log() { logger -t carbonplanner "job $job: $*" 2>/dev/null || true; }
while :; do
    sleep "$interval"
    if ! out=$(scontrol show job "$job" 2>&1); then
        case $out in *"Invalid job id"*) exit 0 ;; esac
        continue # slurmctld unreachable: ask again at the next poll
    fi
    state=$(printf '%s\n' "$out" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1)
    case $state in RUNNING | CONFIGURING | SUSPENDED) ;; *) exit 0 ;; esac
    now_restarts=$(printf '%s\n' "$out" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p' | head -n 1)
    [ "${now_restarts:-0}" = "$restarts" ] || exit 0
    watts=$(printf '%s\n' "$out" | sed -n 's/^ *Comment=//p' | tr ' ' '\n' |
        sed -n 's/^power_limit_w=\([0-9][0-9]*\)$/\1/p' | head -n 1)
    [ -n "$watts" ] && [ "$watts" != "$applied" ] || continue
    if "$tool" -i "$gpus" -pl "$watts" >/dev/null 2>&1; then
        log "power limit $watts W on GPUs $gpus"
    else
        log "$tool -i $gpus -pl $watts failed; the GPUs keep their limit"
    fi
    applied=$watts
done
