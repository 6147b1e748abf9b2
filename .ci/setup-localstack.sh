#!/usr/bin/env bash
# Installs LocalStack's SQS provider (localstack-core, host mode, no Docker) into its own venv
# outside the repository, so tests and benches can use a faithful SQS emulator
# (ckpt_pipeline/local/localstack.py). Idempotent: a completion marker that records the pins
# makes a second run a no-op; a missing or half-built venv is rebuilt.
#
# Why a separate venv with Python 3.13: localstack-core 4.14.0 uses PEP 695 syntax and
# warnings.deprecated, so it does not import on the project's Python 3.11. The four extra pins are
# the ones it needs to start (see /work/shared/TOOLCHAIN-NOTES.md, "LocalStack's SQS").
set -euo pipefail

VENV="${CKPT_LOCALSTACK_VENV:-/var/cache/ckpt-pipeline/venv-localstack}"
PINS=("localstack-core[runtime]==4.14.0" "cbor2<5.7" "pyopenssl<24.3" "cryptography==43.0.3" "service_identity<25")
MARKER="$VENV/.ckpt-installed"
WANT="${PINS[*]}"

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "localstack venv ready: $VENV"
  exit 0
fi

find_python313() {
  if [ -n "${CKPT_LOCALSTACK_PYTHON:-}" ]; then echo "$CKPT_LOCALSTACK_PYTHON"; return; fi
  local root
  for root in "$(pyenv root 2>/dev/null || true)" "${PYENV_ROOT:-}" "$HOME/.pyenv" /root/.pyenv; do
    [ -n "$root" ] || continue
    for py in "$root"/versions/3.13*/bin/python3.13; do
      [ -x "$py" ] && { echo "$py"; return; }
    done
  done
  command -v python3.13 || true
}

PY="$(find_python313)"
if [ -z "$PY" ]; then
  echo "setup-localstack: no Python 3.13 found (pyenv versions/3.13*, python3.13 on PATH," \
       "or CKPT_LOCALSTACK_PYTHON)" >&2
  exit 1
fi

echo "building localstack venv at $VENV with $PY"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
# The machine's pip config names local index directories that do not exist: quiet that noise.
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
# The import check catches the failures the pins exist for (plugins not found, OpenSSL API).
"$VENV/bin/python" -c "import localstack.runtime.main, cbor2._decoder, service_identity, OpenSSL.crypto"
echo "$WANT" > "$MARKER"
echo "localstack venv ready: $VENV"
