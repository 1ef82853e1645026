#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/path/to/prolog-power-limit.sh, with power-limit-watcher.sh beside it): sets the
# GPU power limit of a job whose comment holds one (power_limit_w=<W>, the planner's), and for the planner's jobs
# (named cp|...) starts the watcher that applies the changes a later plan makes while the job runs. The GPUs are
# SLURM_JOB_GPUS. Runs as root on the node (nvidia-smi -pl needs root). It never fails the job: without nvidia-smi,
# a limit or GPUs it only logs, so a job still starts at its planned time.
# GPU_TOOL replaces nvidia-smi; POWER_LIMIT_POLL_S sets the watcher's poll interval (default 60 s).
# slurmd runs prologs without PATH: the system's default unless the caller set one.
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
[ -n "$SLURM_JOB_GPUS" ] || exit 0
tool=${GPU_TOOL:-nvidia-smi}
show=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)
comment=${SLURM_JOB_COMMENT:-$(printf '%s\n' "$show" | sed -n 's/^ *Comment=//p')}
watts=$(printf '%s\n' "$comment" | tr ' ' '\n' | sed -n 's/^power_limit_w=\([0-9][0-9]*\)$/\1/p' | head -n 1)
if [ -z "$watts" ]; then
    :
elif command -v "$tool" >/dev/null 2>&1; then
    "$tool" -i "$SLURM_JOB_GPUS" -pl "$watts" >/dev/null 2>&1 ||
        logger -t carbonplanner "job $SLURM_JOB_ID: $tool -pl $watts on GPUs $SLURM_JOB_GPUS failed" 2>/dev/null
else
    logger -t carbonplanner "job $SLURM_JOB_ID: no $tool; power limit $watts W not applied" 2>/dev/null
fi
# the planner's jobs only (one scontrol call per poll each): the watcher in its own session, detached from the
# prolog, which must end for the job to start. slurmd ends the prolog's process group when the prolog exits, so it
# waits until the watcher runs in its new session: the watcher closes its output then, ending the $(...).
case $(printf '%s\n' "$show" | sed -n 's/.*JobName=\(.*\)$/\1/p' | head -n 1) in cp\|*) ;; *) exit 0 ;; esac
watcher=$(dirname "$0")/power-limit-watcher.sh
if [ -x "$watcher" ] && command -v setsid >/dev/null 2>&1; then
    detached=$(setsid -f "$watcher" "$SLURM_JOB_ID" "$SLURM_JOB_GPUS" "$watts" "${SLURM_JOB_RESTART_COUNT:-0}" \
        </dev/null 2>/dev/null)
fi
exit 0
