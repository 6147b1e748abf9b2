"""Issue 40: an ``upload_to`` that cannot succeed is loud and recoverable.

One real ``Trainer`` process (a user's script: logging not configured) uploading through moto's
S3 server: a bucket that does not exist refuses the start in one line; a bucket that disappears
after the start leaves every checkpoint with a line on stderr naming S3's error; a spool left by
a killed upload is finished by ``ckpt-pipeline spool send`` once the bucket is back, or named
checkpoint by checkpoint (exit 1) while it is not.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.cli import main
from tests.e2e.conftest import PipelineFactory
from tests.trainer_client.helpers import rows_until, run_child

pytestmark = pytest.mark.slow

# argv: output_dir, spool_dir, upload_to, then "delete-bucket-at-2" and/or "kill-at-end".
_SCRIPT = """
import os, signal, sys, boto3, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from trainer_client.integrations.huggingface import CheckpointReporterCallback

out, spool, upload_to, *modes = sys.argv[1:]
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1))
class Data(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        x = torch.arange(8) % 64
        return {"input_ids": x, "labels": x}

class BucketGoneAt2(TrainerCallback):
    # Before the reporter's on_save: the bucket that passed the start's check is gone.
    def on_save(self, args, state, control, **kw):
        if state.global_step == 2:
            boto3.client("s3").delete_bucket(Bucket=upload_to.split("/")[2])

args = TrainingArguments(
    output_dir=out, save_steps=2, max_steps=4, logging_steps=1, report_to=[],
    per_device_train_batch_size=2, use_cpu=True, disable_tqdm=True,
)
class KillAtEnd(TrainerCallback):
    # Before the reporter's on_train_end (its close): the process dies while uploading.
    def on_train_end(self, args, state, control, **kw):
        os.kill(os.getpid(), signal.SIGKILL)

callback = CheckpointReporterCallback(spool_dir=spool, upload_to=upload_to)
callbacks = [BucketGoneAt2()] if "delete-bucket-at-2" in modes else []
callbacks += [KillAtEnd()] if "kill-at-end" in modes else []
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[*callbacks, callback])
try:
    trainer.train()
finally:
    callback.close()
print("failures", callback.failures, "reported", sorted(callback.reported_steps))
"""


def _run(pipeline: Any, tmp_path: Path, upload_to: str, *modes: str, job: str) -> Any:
    return run_child(
        _SCRIPT,
        str(tmp_path / "out"),
        str(tmp_path / "spool"),
        upload_to,
        *modes,
        timeout=600,
        **pipeline.client_env(),
        CKPT_JOB_ID=job,
        WORLD_SIZE="1",
    )


def test_a_bucket_that_does_not_exist_refuses_the_start_in_one_line(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    missing = f"s3://no-such-{uuid.uuid4().hex[:12]}/runs"
    with pipeline_factory() as pipeline:
        done = _run(pipeline, tmp_path, missing, job="up-missing")
    assert done.returncode != 0, done.stdout + done.stderr[-3000:]
    # The refusal's line names the option, the prefix and S3's answer; nothing was trained.
    last = done.stderr.strip().splitlines()[-1]
    assert f"IntegrationError: upload_to: {missing}: cannot be written: NoSuchBucket" in last, (
        done.stderr[-3000:]
    )
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_an_upload_failing_midway_says_so_per_checkpoint_with_s3s_error(
    pipeline_factory: PipelineFactory, s3: Any, tmp_path: Path
) -> None:
    bucket = f"ckpt-gone-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    with pipeline_factory() as pipeline:
        done = _run(pipeline, tmp_path, f"s3://{bucket}/run", "delete-bucket-at-2", job="up-gone")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "failures 2 reported []" in done.stdout, done.stdout + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    # The failure as it happens, with S3's own error (checkpoint-4 waits behind it) ...
    failed = [line for line in lines if "post-step 's3_upload' of step" in line]
    assert [line.split("of step ")[1].split(" ")[0] for line in failed] == ["2"], lines
    assert "NoSuchBucket" in failed[0], failed
    # ... and each checkpoint left unreported at the end, with why.
    left = [line for line in lines if "not reported (deferred)" in line]
    assert [line.split("checkpoint-")[1].split(" ")[0] for line in left] == ["2", "4"], lines
    assert all("NoSuchBucket" in line for line in left), left
    print("\n".join(failed + left))


def test_spool_send_finishes_a_killed_upload_once_the_bucket_is_back(
    pipeline_factory: PipelineFactory,
    s3: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bucket = f"ckpt-back-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    prefix = f"s3://{bucket}/run"
    with pipeline_factory() as pipeline:
        env = {**os.environ, "CKPT_QUEUE_URL": pipeline.queues.queue_url}
        done = _run(pipeline, tmp_path, prefix, "delete-bucket-at-2", "kill-at-end", job="up-kill")
        assert done.returncode == -9, done.stderr[-4000:]
        jobs = sorted((tmp_path / "spool" / "up-kill").glob("rank-0.finishing/*.json"))
        assert len(jobs) == 2, done.stderr[-3000:]
        capsys.readouterr()
        # WHEN the bucket is still missing: exit 1, each checkpoint named with S3's error
        assert main(["spool", "send", "--dir", str(tmp_path / "spool"), "--timeout", "5"], env) == 1
        out = capsys.readouterr().out
        unfinished = [line for line in out.splitlines() if "checkpoint of step" in line]
        assert [line.split("step ")[1].split(" ")[0] for line in unfinished] == ["2", "4"], out
        assert all("NoSuchBucket" in line for line in unfinished), out
        # WHEN the bucket is back: both are uploaded and reported, exit 0
        s3.create_bucket(Bucket=bucket)
        assert main(["spool", "send", "--dir", str(tmp_path / "spool")], env) == 0, (
            capsys.readouterr().out
        )
        out = capsys.readouterr().out
        assert "2 checkpoints finished" in out, out
        rows = rows_until(
            pipeline.database_url,
            "SELECT step, uri FROM training_checkpoint_shards WHERE job_id = 'up-kill'"
            " ORDER BY step",
            lambda rows: len(rows) == 2,
        )
        assert rows == [(2, f"{prefix}/checkpoint-2"), (4, f"{prefix}/checkpoint-4")]
        assert not list((tmp_path / "spool" / "up-kill").glob("rank-0.finishing/*.json"))


# Lightning, one process: argv output dir, spool, upload_to, then "delete-bucket-at-start".
_LIGHTNING = """
import sys, boto3, torch, lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from trainer_client.integrations.lightning import CheckpointReporting

out, spool, upload_to, *modes = sys.argv[1:]

class Model(pl.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i): return self.layer(batch).pow(2).mean()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
    def on_train_start(self):
        # After the callback's setup checked the bucket: it is gone for every upload.
        if "delete-bucket-at-start" in modes:
            boto3.client("s3").delete_bucket(Bucket=upload_to.split("/")[2])

reporting = CheckpointReporting(
    spool_dir=spool, upload_to=upload_to, tuning={"close_timeout_s": 3.0}
)
trainer = pl.Trainer(
    max_steps=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[ModelCheckpoint(dirpath=out, every_n_train_steps=2, save_top_k=-1), reporting],
    plugins=[reporting.checkpoint_io],
)
trainer.fit(Model(), torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=4))
"""


def test_lightning_refuses_a_missing_bucket_and_says_each_failed_upload(
    pipeline_factory: PipelineFactory, s3: Any, tmp_path: Path
) -> None:
    missing = f"s3://no-such-{uuid.uuid4().hex[:12]}/runs"
    bucket = f"ckpt-pl-gone-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    with pipeline_factory() as pipeline:
        env = {**pipeline.client_env(), "CKPT_JOB_ID": "up-pl", "WORLD_SIZE": "1", "RANK": "0"}
        # WHEN the bucket does not exist: setup refuses in one line, nothing is trained
        refused = run_child(
            _LIGHTNING, str(tmp_path / "a"), str(tmp_path / "s"), missing, timeout=300, **env
        )
        assert refused.returncode != 0, refused.stderr[-3000:]
        last = refused.stderr.strip().splitlines()[-1]
        assert f"upload_to: {missing}: cannot be written: NoSuchBucket" in last, last
        assert not list((tmp_path / "a").glob("*.ckpt"))
        # WHEN it disappears after the start: each checkpoint is said, with S3's error
        done = run_child(
            _LIGHTNING,
            str(tmp_path / "b"),
            str(tmp_path / "s"),
            f"s3://{bucket}/run",
            "delete-bucket-at-start",
            timeout=300,
            **env,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stderr.splitlines()
    failed = [line for line in lines if "post-step 's3_upload' of step 2 failed" in line]
    assert len(failed) == 1 and "NoSuchBucket" in failed[0], lines[-30:]
    left = [line for line in lines if "not reported (deferred)" in line]
    assert [line.split("(step ")[1].split(")")[0] for line in left] == ["2", "4"], lines[-30:]
    assert all("NoSuchBucket" in line for line in left), left
