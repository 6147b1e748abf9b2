#!/usr/bin/env bash
# usage: bench/beside_dd.sh CMD...
# Runs CMD beside another process that keeps the disk busy: a loop rewriting 2 GB with
# `dd … conv=fsync` into DD_FILE (default: a file in /tmp, the file system of
# `bench.save_overhead`'s work directory), as BENCHMARKS.md §8's busy-disk `--done-check` does.
# DD_MB sets the size rewritten each time (default 2048).
# The loop and its file are removed when CMD ends; CMD's exit status is returned.
set -u
file=${DD_FILE:-${TMPDIR:-/tmp}/beside-dd-$$}
mb=${DD_MB:-2048}
setsid bash -c "while :; do dd if=/dev/zero of='$file' bs=1M count=$mb conv=fsync status=none; done" &
loop=$!
trap 'kill -- -"$loop" 2>/dev/null; wait "$loop" 2>/dev/null; rm -f "$file"' EXIT
echo "[beside_dd] dd loop into $file since $(date -u +%T) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$@"
rc=$?
echo "[beside_dd] end $(date -u +%T) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
