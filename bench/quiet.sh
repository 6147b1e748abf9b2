#!/usr/bin/env bash
# Run one benchmark command in a quiet window: wait (up to QUIET_WAIT_S, default 1800 s) until
# the 1-minute load average is below QUIET_LOAD (default 1.0), then run it under the benches'
# lock (two never overlap), printing the window's UTC start and end and the load at each.
#   QUIET_WHO=restore bench/quiet.sh .venv/bin/python -m bench restore --sizes-gb 1
# QUIET_WHO labels the lines. Exit status: the command's, or 75 if no quiet window came.
set -euo pipefail
who=${QUIET_WHO:-bench}
limit=${QUIET_LOAD:-1.0}
deadline=$((SECONDS + ${QUIET_WAIT_S:-1800}))
lock=${BENCH_LOCK:-${TMPDIR:-/tmp}/bench.lock}
load() { cut -d' ' -f1 /proc/loadavg; }
exec 9>"$lock"
flock 9
until awk -v l="$(load)" -v m="$limit" 'BEGIN { exit !(l < m) }'; do
  if ((SECONDS >= deadline)); then
    echo "quiet[$who]: no window below load $limit within the wait (load $(load))" >&2
    exit 75
  fi
  sleep 5
done
echo "quiet[$who]: window starts $(date -u +%H:%M:%S) UTC, load $(load)" >&2
status=0
"$@" || status=$?
echo "quiet[$who]: window ends $(date -u +%H:%M:%S) UTC, load $(load), exit $status" >&2
exit "$status"
