"""Lightning through the finisher: checksums computed off the training thread, and a checkpoint
that ``save_top_k`` removes while it is being finished never reported (real fit(), moto's SQS)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import AsyncCheckpointIO

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.integrations.lightning_job import TinyRegression, data
from tests.trainer_client.helpers import drain, wait_for
from tests.trainer_client.holds import HoldUntilReleased, hold, release
from trainer_client.integrations.lightning import CheckpointReporting

pytestmark = pytest.mark.slow


def _fit(tmp: Path, reporting: CheckpointReporting, *, use_async: bool, top_k: int) -> None:
    io: Any = reporting.checkpoint_io
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=8,
        default_root_dir=str(tmp),
        callbacks=[
            ModelCheckpoint(
                dirpath=tmp / "ckpt", every_n_train_steps=2, save_top_k=top_k, filename="{step}"
            ),
            reporting,
        ],
        plugins=[AsyncCheckpointIO(io) if use_async else io],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyRegression(tmp, 0.0), train_dataloaders=data())


def _reporting(queues: PipelineQueues, tmp: Path, **options: Any) -> CheckpointReporting:
    return CheckpointReporting(
        queue_url=queues.queue_url,
        job_id="lightning-finisher",
        spool_dir=tmp / "spool",
        checksums=True,
        tuning={"spot_poll": False, "install_signal_handler": False},
        **options,
    )


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_every_checkpoint_is_reported_with_its_files_digest(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, use_async: bool
) -> None:
    # GIVEN checksums on WHEN fit() saves every 2 steps, keeping every file
    _fit(tmp_path, _reporting(pipeline_queues, tmp_path), use_async=use_async, top_k=-1)
    # THEN each step is reported once with its file's size and SHA-256
    bodies = [json.loads(m["Body"]) for m in drain(sqs, pipeline_queues.queue_url, expect=4)]
    assert sorted(b["step"] for b in bodies) == [2, 4, 6, 8]
    for body in bodies:
        data_ = Path(unquote(urlparse(body["uri"]).path)).read_bytes()
        assert (body["bytes"], body["sha256"]) == (len(data_), hashlib.sha256(data_).hexdigest())


def test_a_file_save_top_k_removes_while_finishing_is_not_reported(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN save_top_k=1 (each save removes the previous file) and every checkpoint held in the
    # finisher until step=2's file is gone
    holds = tmp_path / "holds"
    reporting = _reporting(
        pipeline_queues, tmp_path, post=[hold(holds)], post_steps=[HoldUntilReleased()]
    )

    def releaser() -> None:
        # Until then step 2 cannot be reported: it is held, or dropped by a check before.
        # A later save happened (each removes the one before: step=4.ckpt may already be gone
        # again, finish() no longer slows the loop by an fsync)...
        wait_for(
            lambda: any((tmp_path / "ckpt" / f"step={s}.ckpt").exists() for s in (4, 6, 8)),
            timeout=60,
        )
        wait_for(lambda: not (tmp_path / "ckpt" / "step=2.ckpt").exists(), timeout=60)
        release(holds, "all")

    thread = threading.Thread(target=releaser, daemon=True)
    thread.start()
    # WHEN fit() runs (teardown closes the reporter, waiting for the finisher)
    _fit(tmp_path, reporting, use_async=False, top_k=1)
    thread.join(timeout=60)
    # THEN step 2 was never reported; the kept file (step 8) was, with its digest; every step is
    # either reported or dropped, none both
    bodies = [json.loads(m["Body"]) for m in drain(sqs, pipeline_queues.queue_url, expect=1)]
    steps = sorted(b["step"] for b in bodies)
    assert 2 not in steps and 8 in steps
    last = next(b for b in bodies if b["step"] == 8)
    data_ = (tmp_path / "ckpt" / "step=8.ckpt").read_bytes()
    assert last["sha256"] == hashlib.sha256(data_).hexdigest()
    assert not list((tmp_path / "spool").rglob("*.finishing/*.json"))
