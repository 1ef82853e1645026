#!/usr/bin/env bash
# Install the Debian server packages the tests start themselves: PostgreSQL (tests/deploy/), Slurm 22.05 with munge
# (tests/scheduling/slurm/), headless Chromium (tests/ui/, the Carbon pages in a browser) and Prometheus with promtool
# (tests/ui/test_metrics.py, deploy/prometheus/) for `make test`, and Redis too for `make test-all`.
# Usage: deploy/install-services.sh [postgresql] [redis-server] [slurm] [chromium] [prometheus]
# Installs only what is missing, starts no service (the tests run throwaway servers in temporary folders and stop
# them), and creates no default cluster. Without root it only says so: the tests then skip and name the reason.
set -euo pipefail

missing=()
for package in "$@"; do
    case "$package" in
        postgresql) compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql) ;;
        redis-server) command -v redis-server > /dev/null || missing+=(redis-server) ;;
        slurm) { command -v slurmctld && command -v munged; } > /dev/null || missing+=(slurm-wlm munge) ;;
        chromium) command -v chromium > /dev/null || missing+=(chromium) ;;
        prometheus) { command -v prometheus && command -v promtool; } > /dev/null || missing+=(prometheus) ;;
        *) echo "install-services: unknown package $package" >&2; exit 2 ;;
    esac
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
    echo "install-services: ${missing[*]} missing and not root on Debian: the tests that need them will skip" >&2
    exit 0
fi

# No service starts during the install (policy-rc.d 101), and PostgreSQL makes no `main` cluster on port 5432.
added=()
cleanup() { rm -f "${added[@]}"; }
trap cleanup EXIT
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    added+=(/usr/sbin/policy-rc.d)
fi
mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/no-main-cluster.conf
added+=(/etc/postgresql-common/createcluster.d/no-main-cluster.conf)

echo "install-services: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq > /dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
