#!/usr/bin/env bash
# The Debian packages the tests drive, held here once (`make system-deps`, a step of `make test`):
# the browser of the dashboard's tests, the Redis and PostgreSQL servers that test fixtures start
# as processes of their own (edgectl/local_services.py; the system's services are never started),
# and iproute2's `ip` for the network namespaces of the high-availability tests (edgectl/netns.py).
# As root, what is missing is installed (never started); otherwise one line names the command.
set -euo pipefail

# package -> how to tell it is here (a binary, or PostgreSQL's versioned server directory).
declare -A PROBE=(
  [chromium]='command -v chromium'
  [redis-server]='command -v redis-server && command -v redis-cli'
  [postgresql]="compgen -G '/usr/lib/postgresql/*/bin/postgres' && command -v psql"
  [iproute2]='command -v ip'
)
PACKAGES=(chromium redis-server postgresql iproute2)

missing=()
for package in "${PACKAGES[@]}"; do
  eval "${PROBE[$package]}" >/dev/null 2>&1 || missing+=("$package")
done
((${#missing[@]})) || exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "the tests need ${missing[*]}: run \`sudo apt-get install -y ${missing[*]}\`, then \`make test\` again" >&2
  exit 1
fi
# Installed, never started: a policy that refuses every service start while apt runs.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
# The package lists only when apt knows none of these yet (a fresh machine's are empty).
apt-cache show "${missing[@]}" >/dev/null 2>&1 || apt-get update -q
apt-get install -y -q "${missing[@]}"
