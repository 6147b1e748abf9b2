#!/usr/bin/env bash
# Makes sure PgBouncer is installed: the writer tests use it (transaction pooling) as the local
# stand-in for RDS Proxy (tests/lambda_writer/test_pgbouncer.py). Called by `make test` and CI.
# Idempotent: a no-op when the binary is already there. It installs only where it can (root and
# apt-get); anywhere else it says why it did not and exits 0, and the PgBouncer tests skip with
# the same advice, so `make test` still runs everything else.
set -uo pipefail

found() {
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || [ -x /usr/bin/pgbouncer ]
}

if found; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-pgbouncer: pgbouncer is not installed and this is not root, so it was not" \
       "installed; the PgBouncer tests will skip (install it: sudo apt-get install -y pgbouncer)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-pgbouncer: pgbouncer is not installed and there is no apt-get here, so it was not" \
       "installed; the PgBouncer tests will skip (install pgbouncer with this system's packages)" >&2
  exit 0
fi

install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer \
    >/dev/null
}

echo "setup-pgbouncer: installing pgbouncer with apt-get" >&2
# A fresh machine may have no package lists yet: update only when the first try fails.
if ! install && ! { apt-get update -qq && install; }; then
  echo "setup-pgbouncer: apt-get could not install pgbouncer (see above); the PgBouncer tests" \
       "will skip" >&2
  exit 0
fi
found && echo "setup-pgbouncer: pgbouncer installed" >&2
exit 0
