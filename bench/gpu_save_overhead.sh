#!/usr/bin/env bash
# The prepared run for a lent machine with ONE CUDA GPU (an H100 or H200, 16 cores; 15 minutes of
# device time in all): under ~8 minutes, every result under $OUT.
#   1. the machine, and its disk's floor: sequential write + fdatasync (dd);
#   2. the HF Trainer with GPT-2 medium (354 M parameters, ~4.25 GB checkpoints with AdamW, bf16),
#      checksums off and on, 3 saves each at the bench's cadence: the framework's save, ours on the
#      training thread, the finish against the disk's own fsync + hash, the step ratio during/outside
#      a finish with its interval (python -m bench save_overhead).
# (bench/sharded_gpu.sh, the Lightning/HF FSDP and DeepSpeed cases, needs two GPUs: not run here.)
#
# DRY=1 runs the same steps on the CPU with tiny sizes in seconds (tests/bench/test_gpu_script.py).
# On the lent machine (python3 3.12 with torch, transformers, lightning; no boto3, pydantic, moto):
# the wheels the client and moto need, if carried in wheelhouse/gpu/, are installed first:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d wheelhouse/gpu boto3 pydantic 'moto[server]' psycopg-binary
#   run(command="OUT=$OUT bash bench/gpu_save_overhead.sh", carry=["wheelhouse"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/save-overhead-gpu}
WORK=${WORK:-/tmp/save-overhead-work}
mkdir -p "$OUT" "$WORK"
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if compgen -G "wheelhouse/gpu/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site wheelhouse/gpu/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "${DRY:-0}" = 1 ]; then
  DEVICE=cpu HF=(--model ballast --sizes-gb 0.002 --saves 1 --min-idle 3 --workers 0)
else
  DEVICE=cuda HF=(--model gpt2-medium --sizes-gb 4 --saves 3 --min-idle 20 --workers 4)
fi
{
  if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  echo "cpus $(nproc)"; free -g | sed -n 2p; df -h "$WORK" | tail -1
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  dd if=/dev/zero of="$WORK/ddtest" bs=16M count=$([ "$DEVICE" = cuda ] && echo 128 || echo 2) \
    conv=fdatasync 2>&1 | tail -1
  rm -f "$WORK/ddtest"
  uptime
} 2>&1 | tee "$OUT/machine.txt"
status=0
"$PY" -m bench save_overhead --device "$DEVICE" --frameworks hf --modes finish finish+sha \
  "${HF[@]}" --work-dir "$WORK" 2>&1 | tee "$OUT/save_overhead.txt" || status=1
uptime | tee -a "$OUT/machine.txt"
rm -rf "$WORK"
exit $status
