#!/usr/bin/env bash
# make test-stress: run the command given (the process-starting tests) while stress-ng keeps both
# cores, the disk and memory busy, as a loaded CI machine does; stress-ng is stopped when the
# command ends, whatever its result. Races that only load exposes (a spool-send count, an async
# write, a kill that lands early) fail here instead of in a clean-clone CI run.
# STRESS_ARGS overrides the load (stress-ng's own options).
set -euo pipefail
if ! command -v stress-ng >/dev/null 2>&1; then
    echo "test-stress: stress-ng is not installed (bash .ci/setup-faults.sh installs it)" >&2
    exit 1
fi
# --timeout is a backstop only: a killed make leaves no load behind for longer than the limit.
read -r -a load <<<"${STRESS_ARGS:---cpu 2 --io 1 --vm 1 --vm-bytes 1G}"
stress-ng "${load[@]}" --timeout 3600s --quiet &
stress_pid=$!
stop_stress() {
    kill -TERM "$stress_pid" 2>/dev/null || true
    wait "$stress_pid" 2>/dev/null || true
}
trap stop_stress EXIT
start=$(date +%s)
rc=0
"$@" || rc=$?
echo "test-stress: exit ${rc} after $(($(date +%s) - start)) s under stress-ng ${load[*]}"
exit "$rc"
