#!/bin/sh
# Installs what the Slurm tests need (slurm-wlm 22.05 and munge, Debian 12) when it is missing and we are root.
# Without root or apt-get it does nothing: the Slurm tests then skip, naming why.
set -e
command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deploy/slurm/install.sh: slurm-wlm/munge missing and not root with apt-get; the Slurm tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }
