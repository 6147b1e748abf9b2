"""The Hugging Face callback through the finisher: real Trainer, real files, moto's SQS.

``on_save`` returns once the checkpoint's finish job is on disk; these tests hold the finisher
with a real post-step (tests/trainer_client/holds.py) to show what happens meanwhile: a SIGKILL,
a rotation by ``save_total_limit``, the bound on checkpoints in finishing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.torchrun import free_port, torchrun_env
from tests.trainer_client.helpers import REPO_ROOT, child_env, drain, wait_for
from tests.trainer_client.holds import HoldUntilReleased, hold, release
from trainer_client import CheckpointReporter

RUN_TIMEOUT_S = 150.0


def _bodies(sqs: Any, queue_url: str, expect: int) -> list[dict[str, Any]]:
    return [json.loads(m["Body"]) for m in drain(sqs, queue_url, expect=expect, timeout=10.0)]


def _files(directory: Path) -> dict[str, Path]:
    return {p.relative_to(directory).as_posix(): p for p in directory.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_save_whose_on_save_returned_before_a_sigkill_is_reported_by_the_next_start(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    job_id = f"hf-kill-{uuid.uuid4().hex[:8]}"
    spool, out, holds = tmp_path / "spool", tmp_path / "out", tmp_path / "holds"
    log = tmp_path / "rank.log"
    # GIVEN one Trainer process, its checkpoints held in the finisher, SIGKILLed right after the
    # callback's on_save of checkpoint-3 returned
    options = {
        "output_dir": str(out),
        "result_dir": str(tmp_path),
        "max_steps": 6,
        "save_steps": 3,
        "checksums": True,
        "hold_dir": str(holds),
        "kill_after_report_at_save": 3,
    }
    env = child_env(
        CKPT_QUEUE_URL=pipeline_queues.queue_url,
        CKPT_JOB_ID=job_id,
        CKPT_SPOOL_DIR=str(spool),
        **torchrun_env(0, 1, free_port()),
        TORCHELASTIC_RESTART_COUNT="0",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    with log.open("wb") as stderr:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.integrations.hf_rank", json.dumps(options)],
            env=env,
            cwd=REPO_ROOT,
            stdout=stderr,
            stderr=stderr,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    # THEN its job is on disk and nothing was reported
    records = list((spool / job_id / "rank-0.finishing").glob("*.json"))
    assert len(records) == 1
    assert _bodies(sqs, pipeline_queues.queue_url, expect=0) == []
    # WHEN the next start of a reporter on the same spool runs, the checkpoint released
    release(holds, "all")
    with CheckpointReporter(
        pipeline_queues.queue_url,
        job_id=job_id,
        spool_dir=spool,
        rank=0,
        world_size=1,
        run_attempt=1,
        post_steps=[HoldUntilReleased()],
        install_signal_handler=False,
        spot_poll=False,
    ) as again:
        assert again.flush(30)
    # THEN checkpoint-3 is reported once, as attempt 0, with its files' bytes and digests
    (body,) = _bodies(sqs, pipeline_queues.queue_url, expect=1)
    ckpt = out / "checkpoint-3"
    files = _files(ckpt)
    assert (body["step"], body["run_attempt"]) == (3, 0)
    assert body["uri"] == ckpt.resolve().as_uri()
    assert sorted(body["files"]) == sorted(files)
    assert body["bytes"] == sum(p.stat().st_size for p in files.values())
    assert body["file_sha256"] == {
        name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items()
    }
    assert not list((spool / job_id / "rank-0.finishing").glob("*.json"))


@pytest.mark.slow
def test_rotation_while_finishing_and_the_bound_with_a_real_trainer(
    pipeline_queues: PipelineQueues,
    sqs: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from tests.integrations.hf_rank import TinyData
    from trainer_client.integrations.huggingface import CheckpointReporterCallback

    caplog.set_level(logging.WARNING)
    out, holds = tmp_path / "out", tmp_path / "holds"
    # GIVEN a Trainer keeping one checkpoint (save_total_limit=1), one checkpoint at a time in
    # finishing (max_finishing=1), each held until released
    callback = CheckpointReporterCallback(
        spool_dir=tmp_path / "spool",
        queue_url=pipeline_queues.queue_url,
        job_id=f"hf-rot-{uuid.uuid4().hex[:8]}",
        run_attempt=0,
        checksums=True,
        post=[hold(holds)],
        post_steps=[HoldUntilReleased()],
        max_finishing=1,
        install_signal_handler=False,
        spot_poll=False,
    )
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=True,
        per_device_train_batch_size=2,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=1,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    config = GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)

    class TrainOnOnceHeld(TrainerCallback):  # type: ignore[misc]
        """Step 3 starts only once checkpoint-2 is held in the finisher (fsync'd and hashed)."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                wait_for(lambda: (holds / "held-2").exists(), timeout=RUN_TIMEOUT_S)

    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=TinyData(16),
        callbacks=[callback, TrainOnOnceHeld()],
    )

    def releaser() -> None:
        # Checkpoint-4's save removes checkpoint-2 (still held), then its on_save waits at the
        # bound: only then let both go.
        wait_for(lambda: not (out / "checkpoint-2").exists(), timeout=RUN_TIMEOUT_S)
        wait_for(
            lambda: callback.reporter is not None and callback.reporter.stats.saves_waiting == 1,
            timeout=RUN_TIMEOUT_S,
        )
        release(holds, "all")

    thread = threading.Thread(target=releaser, daemon=True)
    thread.start()
    # WHEN it trains (on_train_end closes the reporter, waiting for finishing)
    trainer.train()
    thread.join(timeout=RUN_TIMEOUT_S)
    # THEN checkpoint-2, rotated away while being finished, is not reported (warned, counted);
    # checkpoint-4's save waited at the bound (logged); checkpoint-4 is reported once
    assert callback.reported_steps == [4] and callback.failures == 1
    assert "checkpoint of step 2 not reported" in caplog.text
    assert "save of step 4 waited" in caplog.text
    (body,) = _bodies(sqs, pipeline_queues.queue_url, expect=1)
    files = _files(out / "checkpoint-4")
    assert body["step"] == 4
    assert body["bytes"] == sum(p.stat().st_size for p in files.values())
    assert body["file_sha256"] == {
        name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items()
    }
