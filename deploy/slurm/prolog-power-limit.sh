#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/path/to/prolog-power-limit.sh): sets the planned GPU power limit of a job
# dispatched by the carbon-aware planner. The limit is in the job's comment (power_limit_w=<W>), the GPUs in
# SLURM_JOB_GPUS. Runs as root on the node (nvidia-smi -pl needs root). It never fails the job: without
# nvidia-smi, a limit or GPUs it only logs, so a job still starts at its planned time.
# slurmd runs prologs without PATH: the system's default unless the caller set one.
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
export PATH
comment=${SLURM_JOB_COMMENT:-$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*Comment=\(.*\)$/\1/p')}
watts=$(printf '%s\n' "$comment" | tr ' ' '\n' | sed -n 's/^power_limit_w=\([0-9][0-9]*\)$/\1/p' | head -n 1)
[ -n "$watts" ] && [ -n "$SLURM_JOB_GPUS" ] || exit 0
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -i "$SLURM_JOB_GPUS" -pl "$watts" >/dev/null 2>&1 ||
        logger -t carbonplanner "job $SLURM_JOB_ID: nvidia-smi -pl $watts on GPUs $SLURM_JOB_GPUS failed"
else
    logger -t carbonplanner "job $SLURM_JOB_ID: no nvidia-smi; power limit $watts W not applied" 2>/dev/null
fi
exit 0
