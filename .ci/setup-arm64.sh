#!/usr/bin/env bash
# Builds (once) the Debian arm64 + python3.14 root that tests/infra/test_arm64_bundle.py runs the
# synthesized Lambda asset in, under qemu-user (issue 13 item 9). Idempotent: every step checks
# first, so a second run with the cache in place only re-registers binfmt if needed (~0 s).
#
# The root lives OUTSIDE the repository, in ARM64_ROOT (default /var/cache/ckpt-pipeline/
# arm64-root); it is complete only when $ROOT/.ckpt-arm64-complete exists, written last — an
# interrupted debootstrap leaves no marker and is wiped and redone.
#
# binfmt: the qemu-aarch64 handler is LEFT REGISTERED on purpose. CI runs this script and then
# the test suite, which needs it; the entry is kernel state that vanishes on reboot and only
# makes aarch64 binaries runnable (it changes nothing for native ones). Unregister by hand with
# `echo -1 > /proc/sys/fs/binfmt_misc/qemu-aarch64` (or `.ci/setup-arm64.sh --unregister`).
#
# ROOT_ARCH=amd64 builds the same root for this host's own architecture instead (no qemu, ~1 min,
# in AMD64_ROOT, default /var/cache/ckpt-pipeline/amd64-root): the Lambda runtime's Python version
# run natively, for `python -m bench cold_start --runtime-root` and tests/bench/test_cold_start.py.
#
# Needs root (apt-get, mount, debootstrap, chroot). Timings measured here: root ~6 min, 355 MB.
set -euo pipefail

ARCH="${ROOT_ARCH:-arm64}"
case "$ARCH" in
  arm64) MACHINE=aarch64; ROOT="${ARM64_ROOT:-/var/cache/ckpt-pipeline/arm64-root}" ;;
  amd64) MACHINE=x86_64; ROOT="${AMD64_ROOT:-/var/cache/ckpt-pipeline/amd64-root}" ;;
  *) echo "setup-arm64: ROOT_ARCH must be arm64 or amd64, got '$ARCH'" >&2; exit 2 ;;
esac
FOREIGN=$([ "$(uname -m)" != "$MACHINE" ] && echo 1 || true)
MARKER="$ROOT/.ckpt-$ARCH-complete"
# Debian forky (testing) ships python3.14 for arm64; trixie has only 3.13. forky is not in the
# bookworm debootstrap of this machine, so the generic "sid" script is used for it.
SUITE="${ARM64_SUITE:-forky}"
PACKAGES="python3.14"
BINFMT=/proc/sys/fs/binfmt_misc

log() { echo "setup-arm64: $*" >&2; }

if [ "${1:-}" = "--unregister" ]; then
  [ -e "$BINFMT/qemu-aarch64" ] && echo -1 >"$BINFMT/qemu-aarch64"
  log "qemu-aarch64 binfmt handler unregistered"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root"; exit 1
fi

# The mirror this machine's apt already uses (deb822 "URIs:" or one-line "deb URL suite").
mirror() {
  local m
  m=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  if [ -z "$m" ]; then
    m=$(grep -hE '^deb +[^[]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  fi
  echo "${ARM64_MIRROR:-${m:-http://deb.debian.org/debian}}"
}

# /usr/sbin may be missing from a non-login PATH (CI's environment): look for the files.
if [ ! -x /usr/sbin/debootstrap ] || { [ -n "$FOREIGN" ] && [ ! -e /usr/lib/binfmt.d/qemu-aarch64.conf ]; }; then
  log "installing qemu-user-static debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap
fi

if [ -n "$FOREIGN" ] && [ ! -e "$BINFMT/register" ]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT"
fi
if [ -n "$FOREIGN" ] && [ ! -e "$BINFMT/qemu-aarch64" ]; then
  # The F flag in Debian's entry opens the interpreter at registration time, so it also works
  # inside a chroot that has no /usr/bin/qemu-aarch64-static of its own.
  grep -o ':qemu-aarch64:.*' /usr/lib/binfmt.d/qemu-aarch64.conf >"$BINFMT/register"
  log "registered qemu-aarch64 binfmt handler"
fi

# The marker starts with what the root was built from: a root of another suite or package set
# is rebuilt rather than trusted.
WANT="suite=$SUITE packages=$PACKAGES"
if [ -e "$MARKER" ] && [[ "$(cat "$MARKER")" == "$WANT "* ]]; then
  log "root complete at $ROOT ($(cat "$MARKER"))"
  exit 0
fi

if [ -e "$ROOT" ]; then
  log "incomplete or outdated root at $ROOT: removing"
  # An interrupted debootstrap can leave proc/sys mounted inside the root: unmount them (deepest
  # first) so that rm, which stays on one file system, removes everything.
  findmnt -R -n -l -o TARGET "$ROOT" 2>/dev/null | sort -r | while read -r mnt; do
    umount -l "$mnt" || true
  done
  rm -rf --one-file-system "$ROOT"
fi
mkdir -p "$(dirname "$ROOT")"
MIRROR=$(mirror)
log "debootstrap $SUITE $ARCH from $MIRROR into $ROOT (takes ~6 min under qemu, ~1 min native)"
start=$(date +%s)
debootstrap --arch="$ARCH" --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" \
  /usr/share/debootstrap/scripts/sid
chroot "$ROOT" /usr/bin/python3.14 -c "import platform, sys; assert platform.machine() == '$MACHINE', platform.machine(); print(sys.version)"
echo "$WANT built=$(date -u +%FT%TZ) seconds=$(($(date +%s) - start))" >"$MARKER"
log "root complete: $(cat "$MARKER")"
