#!/usr/bin/env bash
# Fault-injection tools for tests/trainer_client (libfiu's fiu-run); idempotent, root + apt only.
set -euo pipefail
if ! command -v fiu-run >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "setup-faults: not root or no apt-get; libfiu tests will skip" >&2
        exit 0
    fi
    apt-get install -y fiu-utils libfiu0 >/dev/null 2>&1 || {
        apt-get update >/dev/null && apt-get install -y fiu-utils libfiu0 >/dev/null
    }
fi
fiu-run -h >/dev/null 2>&1 || true
echo "setup-faults: $(command -v fiu-run)"
