#!/usr/bin/env bash
# bench.save_overhead on one CUDA GPU: the HF Trainer (GPT-2 in bf16), Lightning (sync and
# AsyncCheckpointIO) and atomic_torch_save_async at 0.1, 1 and 4 GB, checksums off and on, with
# the machine's description and its disk's fdatasync write speed beside the figures.
#
# Needs this repository with torch (CUDA), transformers, lightning and the local extra (moto)
# installed, e.g. pip install -e '.[huggingface,lightning,local]'. No network: moto's SQS runs
# on loopback. Writes under $OUT (default /tmp/save-overhead-gpu); checkpoints under $WORK
# (default /tmp/save-overhead-work, about 3 x 4 GB at a time, deleted after each run).
#
#   bash bench/gpu_save_overhead.sh            # the whole grid
#   SIZES="1 4" FRAMEWORKS=hf bash bench/gpu_save_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/save-overhead-gpu}
WORK=${WORK:-/tmp/save-overhead-work}
SIZES=${SIZES:-0.1 1 4}
FRAMEWORKS=${FRAMEWORKS:-hf lightning lightning-async plain}
mkdir -p "$OUT" "$WORK"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cpus $(nproc)"; free -g | sed -n 2p; df -h "$WORK" | tail -1
  python3 -c 'import torch, transformers, lightning; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "lightning", lightning.__version__)'
  # The floor under any durable checkpoint: sequential write + fdatasync on the checkpoint disk.
  dd if=/dev/zero of="$WORK/ddtest" bs=16M count=128 conv=fdatasync 2>&1 | tail -1
  rm -f "$WORK/ddtest"
  uptime
} 2>&1 | tee "$OUT/machine.txt"
# shellcheck disable=SC2086  # SIZES and FRAMEWORKS are word lists
python3 -m bench save_overhead --device cuda --sizes-gb $SIZES --frameworks $FRAMEWORKS \
  --workers 4 --work-dir "$WORK" --plot "$OUT" 2>&1 | tee "$OUT/save_overhead.txt"
uptime | tee -a "$OUT/save_overhead.txt"
# The sharded saves' CUDA-only strategies (Lightning FSDP/DeepSpeed, the HF Trainer's FSDP): two
# ranks, one GPU each, through the local pipeline and PostgreSQL (bench/sharded_gpu.sh).
GPUS=$(nvidia-smi -L | wc -l)
if [ "$GPUS" -ge 2 ] && pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  bash bench/sharded_gpu.sh 2>&1 | tee "$OUT/sharded_gpu.txt"
else
  echo "sharded saves on CUDA not run: $GPUS GPU(s), PostgreSQL on 127.0.0.1:5432 $(pg_isready -h 127.0.0.1 -p 5432 2>&1 || true)" | tee "$OUT/sharded_gpu.txt"
fi
