#!/usr/bin/env bash
# The sharded-save strategies that need CUDA, run for real on a machine with two or more GPUs:
# Lightning FSDPStrategy (sharded and full state dict) and DeepSpeedStrategy (ZeRO 2, without the
# CPU test subclass), the Hugging Face Trainer with accelerate's FSDP1/FSDP2 (sharded and full
# state dict). Each case is the CPU tests' scenario: two ranks (NCCL, one GPU each) checkpoint
# through the local pipeline (moto's SQS, the real writer, PostgreSQL on 127.0.0.1:5432 as for
# `make test`), rank 1 (rank 0 for a one-file save) is SIGKILLed inside a save, the job resumes
# from latest_complete_checkpoint and the loss continues.
#
#   bash bench/sharded_gpu.sh            # from the repository root, after `make install`
#   bash bench/sharded_gpu.sh -k fsdp2   # any pytest selection
#
# CKPT_REQUIRE_CUDA=1 turns the cases' skip into a failure: a machine without two GPUs cannot
# pass this script by skipping everything. bench/gpu_save_overhead.sh runs it at its end where
# two GPUs and PostgreSQL are there. Python: the repository's .venv, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD" CKPT_REQUIRE_CUDA=1
exec "$PY" -m pytest -m cuda -p no:cacheprovider -v \
    tests/integrations/test_lightning_sharded.py tests/integrations/test_huggingface.py "$@"
