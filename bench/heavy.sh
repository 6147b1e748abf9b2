#!/usr/bin/env bash
# Run a bench's preparation (filling a database or a store: not itself measured) under the
# benches' lock at the lowest CPU and I/O priority, so that it never overlaps a measurement and
# yields to anything else on the machine.
#   bench/heavy.sh .venv/bin/python -m bench read_paths --fill-only …
set -euo pipefail
lock=${BENCH_LOCK:-${TMPDIR:-/tmp}/bench.lock}
exec 9>"$lock"
flock 9
exec nice -n 19 ionice -c 3 "$@"
