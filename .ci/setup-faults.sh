#!/usr/bin/env bash
# Fault-injection tools: libfiu's fiu-run (tests/trainer_client) and stress-ng (make test-stress,
# which loads both cores while the process-starting tests run); idempotent, root + apt only.
set -euo pipefail
missing=()
command -v fiu-run >/dev/null 2>&1 || missing+=(fiu-utils libfiu0)
command -v stress-ng >/dev/null 2>&1 || missing+=(stress-ng)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "setup-faults: not root or no apt-get; libfiu tests will skip, make test-stress cannot run" >&2
        exit 0
    fi
    apt-get install -y "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null
    }
fi
fiu-run -h >/dev/null 2>&1 || true
echo "setup-faults: $(command -v fiu-run) $(command -v stress-ng)"
