"""Lightning, for real: two DDP ranks over gloo, a rank SIGKILLed mid-run, the job resumed from the
database; asserted on the rows the real writer stored through moto's SQS."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import lightning.pytorch as pl
import psycopg
import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import AsyncCheckpointIO
from lightning.pytorch.strategies import DeepSpeedStrategy, SingleDeviceStrategy

from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.lightning_job import TinyRegression, data
from tests.integrations.sharded_helpers import job_env
from tests.trainer_client.helpers import drain
from trainer_client.exceptions import IntegrationError
from trainer_client.integrations._lightning_layout import save_layout
from trainer_client.integrations.lightning import CheckpointReporting, ReportingCheckpointIO
from trainer_client.restart.lookup import latest_complete_checkpoint

pytestmark = pytest.mark.slow

JOB_SCRIPT = Path(__file__).with_name("lightning_job.py")
ROOT = Path(__file__).resolve().parents[2]
EVERY_N_STEPS = 4
# More steps than the first run can reach before it is killed: the kill always lands mid-run.
UNREACHABLE_STEPS = 100_000
PAUSE_S = 0.05
START_TIMEOUT_S = 120.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float, proc: Any) -> None:
    """Wait for ``condition``; fail naming ``what`` at the deadline or if the job exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"job exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout} s")
        time.sleep(0.1)


def progress(run_dir: Path, rank: int) -> dict[str, Any] | None:
    path = run_dir / f"progress-{rank}.json"
    return json.loads(path.read_text()) if path.exists() else None


def launch(
    pipeline: LocalPipeline, job: str, tmp: Path, run_dir: Path, **options: Any
) -> subprocess.Popen[bytes]:
    """The job's launcher (two CPU ranks) in its own session, so the whole job can be killed."""
    run_dir.mkdir(parents=True)
    env = job_env(pipeline, job, tmp)
    args = {
        "ckpt_dir": str(tmp / "ckpt"),
        "progress_dir": str(run_dir),
        "every_n_steps": EVERY_N_STEPS,
        "pause_s": PAUSE_S,
        "database_url": pipeline.database_url,
        **options,
    }
    log = (run_dir / "job.log").open("wb")
    return subprocess.Popen(
        [sys.executable, str(JOB_SCRIPT), json.dumps(args)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def complete_steps(url: str, job: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT step FROM training_checkpoints WHERE job_id = %s AND is_complete ORDER BY step",
            (job,),
        ).fetchall()
    return [int(r[0]) for r in rows]


Checkpoints = dict[int, tuple[int, int, bool, dict[int, tuple[int, str]]]]


def checkpoints(url: str, job: str) -> Checkpoints:
    """step -> (run_attempt, world_size, is_complete, {rank: (shard run_attempt, uri)})."""
    with psycopg.connect(url) as conn:
        heads = conn.execute(
            "SELECT step, run_attempt, world_size, is_complete FROM training_checkpoints"
            " WHERE job_id = %s",
            (job,),
        ).fetchall()
        shards = conn.execute(
            "SELECT step, rank, run_attempt, uri FROM training_checkpoint_shards WHERE job_id = %s",
            (job,),
        ).fetchall()
    result: Checkpoints = {int(s): (int(a), int(w), bool(c), {}) for s, a, w, c in heads}
    for step, rank, attempt, uri in shards:
        result[int(step)][3][int(rank)] = (int(attempt), str(uri))
    return result


def check_every_complete_checkpoint_is_real(rows: Checkpoints) -> None:
    """Each complete checkpoint: both ranks of its attempt, one URI, a file holding that step."""
    for step, (attempt, world, complete, shards) in rows.items():
        if not complete:
            continue
        assert world == 2 and sorted(shards) == [0, 1], step
        assert {a for a, _ in shards.values()} == {attempt}, step
        (uri,) = {u for _, u in shards.values()}
        path = Path(unquote(urlparse(uri).path))
        saved = torch.load(path, weights_only=False, map_location="cpu")
        assert saved["global_step"] == step, (step, path)


def kill_job(proc: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGKILL rank 1 mid-run, then the whole job (a surviving DDP rank would hang in gloo)."""
    rank1 = progress(run_dir, 1)
    assert rank1 is not None
    os.kill(rank1["pid"], signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    rank0 = progress(run_dir, 0)
    if rank0 is not None:
        # A rank outside the launcher's process group would survive killpg: make sure of rank 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank0["pid"], signal.SIGKILL)
    proc.wait(30)


def test_ddp_job_killed_mid_run_resumes_from_the_latest_complete_checkpoint(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    job = f"lightning-{uuid.uuid4().hex[:8]}"
    with pipeline_factory() as pipeline:
        url = pipeline.database_url
        # GIVEN a two-rank DDP fit() that checkpoints every 4 steps, killed once the database
        # holds two complete checkpoints (rank 1 SIGKILLed, then the whole job)
        first = launch(pipeline, job, tmp_path, tmp_path / "run-0", max_steps=UNREACHABLE_STEPS)
        try:
            wait_until(
                lambda: len(complete_steps(url, job)) >= 2,
                "two complete checkpoints",
                START_TIMEOUT_S,
                first,
            )
            kill_job(first, tmp_path / "run-0")
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        settle(pipeline)
        before = checkpoints(url, job)
        check_every_complete_checkpoint_is_real(before)
        point = latest_complete_checkpoint(job, database_url=url)
        assert point is not None and point.run_attempt == 0 and point.world_size == 2
        resumed_at = point.step
        assert resumed_at >= 2 * EVERY_N_STEPS and resumed_at % EVERY_N_STEPS == 0
        assert point.path == str(tmp_path / "ckpt" / f"step={resumed_at}.ckpt")

        # WHEN the job is launched again, resuming from the database, with async checkpoint IO
        target = resumed_at + 2 * EVERY_N_STEPS
        second = launch(
            pipeline,
            job,
            tmp_path,
            tmp_path / "run-1",
            max_steps=target,
            resume=True,
            async_io=True,
        )
        try:
            assert second.wait(START_TIMEOUT_S) == 0, (tmp_path / "run-1" / "job.log").read_text()
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
        settle(pipeline)

        # THEN both ranks started from the checkpoint the database named
        for rank in (0, 1):
            run = progress(tmp_path / "run-1", rank)
            assert run is not None and run["start_step"] == resumed_at and run["step"] == target
        # ... the new attempt's checkpoints are complete, each with both ranks and one real file
        after = checkpoints(url, job)
        check_every_complete_checkpoint_is_real(after)
        for step in (resumed_at + EVERY_N_STEPS, target):
            attempt, _, complete, _ = after[step]
            assert complete and attempt == 1, (step, after[step])
        # ... steps the killed attempt checkpointed up to the resume point keep their rows
        for step in range(EVERY_N_STEPS, resumed_at + 1, EVERY_N_STEPS):
            assert after.get(step) == before.get(step) and before[step][2], step
        # ... the resume helper now names the final checkpoint, and nothing went to the DLQ
        final = latest_complete_checkpoint(job, database_url=url)
        assert final is not None and (final.step, final.run_attempt) == (target, 1)
        assert pipeline.dlq_depth() == 0


def test_ranks_that_would_resume_from_different_checkpoints_refuse_to_train(
    pipeline_factory: PipelineFactory, tmp_path: Path, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN two checkpoints of the model, and a launch whose ranks were told different ones
    single = tmp_path / "single"
    fit(single, reporting_for(pipeline_queues, single, GatedIO()), None)
    paths = {"0": str(single / "ckpt" / "step=2.ckpt"), "1": str(single / "ckpt" / "step=4.ckpt")}
    job = f"diverged-{uuid.uuid4().hex[:8]}"
    with pipeline_factory() as pipeline:
        proc = launch(
            pipeline, job, tmp_path, tmp_path / "run", max_steps=20, ckpt_path_by_rank=paths
        )
        try:
            code = proc.wait(START_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        log = (tmp_path / "run" / "job.log").read_text()
        # THEN the job stops before its first step, saying why, and reports nothing
        assert code != 0 and "ranks resumed differently" in log, log
        settle(pipeline)
        assert checkpoints(pipeline.database_url, job) == {}


# -- one process: the order of write and report, and what is refused --------------------------


class GatedIO(TorchCheckpointIO):
    """Lightning's own IO, but each write waits for ``gate``; the write of ``fail_at`` fails."""

    def __init__(self, fail_at: str | None = None) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_at = fail_at

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        self.gate.wait(60)
        if self.fail_at and self.fail_at in str(path):
            raise OSError(28, "No space left on device (injected)", str(path))
        super().save_checkpoint(checkpoint, path, storage_options)


class Observe(pl.Callback):
    """At one step, records what the reporter had reported and which files existed, then opens
    the IO's gate (runs before ModelCheckpoint: Lightning orders checkpoint callbacks last)."""

    def __init__(self, reporting: CheckpointReporting, io: GatedIO, at_step: int) -> None:
        self.reporting, self.io, self.at_step = reporting, io, at_step
        self.seen: tuple[int, list[str]] | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step and self.seen is None:
            assert self.reporting.reporter is not None
            ckpt = Path(trainer.default_root_dir) / "ckpt"
            files = sorted(p.name for p in ckpt.glob("*.ckpt")) if ckpt.exists() else []
            self.seen = (self.reporting.reporter.stats.reported, files)
            self.io.gate.set()


def reporting_for(queues: PipelineQueues, tmp: Path, io: GatedIO) -> CheckpointReporting:
    return CheckpointReporting(
        queue_url=queues.queue_url,
        job_id="lightning-unit",
        spool_dir=tmp / "spool",
        checkpoint_io=io,
        tuning={"spot_poll": False, "install_signal_handler": False},
    )


def fit(tmp: Path, reporting: CheckpointReporting, io: Any, *callbacks: pl.Callback) -> None:
    """A single-process fit() of 8 steps, checkpointing every 2 (``io=None``: the reporting IO)."""
    io = reporting.checkpoint_io if io is None else io
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=8,
        default_root_dir=str(tmp),
        callbacks=[
            ModelCheckpoint(
                dirpath=tmp / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}"
            ),
            reporting,
            *callbacks,
        ],
        plugins=[io],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(TinyRegression(tmp, 0.0), train_dataloaders=data())
    finally:
        # THEN, however fit() ended, the trainer's save is its own again and the reporter closed
        assert "save_checkpoint" not in trainer.__dict__ and reporting.reporter is None


def reported_steps(sqs: Any, queues: PipelineQueues, expect: int) -> list[int]:
    return sorted(
        json.loads(m["Body"])["step"] for m in drain(sqs, queues.queue_url, expect=expect)
    )


def test_async_write_is_reported_only_after_it_completed(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN async checkpoint IO whose first write is held back until step 4
    io = GatedIO()
    io.gate.clear()
    reporting = reporting_for(pipeline_queues, tmp_path, io)
    observe = Observe(reporting, io, at_step=4)
    fit(tmp_path, reporting, AsyncCheckpointIO(reporting.checkpoint_io), observe)
    # THEN while the step-2 write was pending nothing was reported and no file was there
    assert observe.seen == (0, [])
    # ... and once written, every checkpoint was reported, each with its file's size
    bodies = [json.loads(m["Body"]) for m in drain(sqs, pipeline_queues.queue_url, expect=4)]
    assert sorted(b["step"] for b in bodies) == [2, 4, 6, 8]
    for body in bodies:
        path = Path(unquote(urlparse(body["uri"]).path))
        assert body["bytes"] == path.stat().st_size and body["world_size"] == 1


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_failed_write_is_never_reported(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, use_async: bool
) -> None:
    # GIVEN the write of step 4 fails (disk full)
    io = GatedIO(fail_at="step=4")
    reporting = reporting_for(pipeline_queues, tmp_path, io)
    plugin: Any = (
        AsyncCheckpointIO(reporting.checkpoint_io) if use_async else reporting.checkpoint_io
    )
    # WHEN fit() runs (Lightning raises the async error at the next save or at teardown)
    with pytest.raises(OSError, match="injected"):
        fit(tmp_path, reporting, plugin)
    # THEN step 2 was reported, step 4 never; async, the IO went on writing meanwhile: Lightning
    # raises the failure at the first save() that checks after it happened (AsyncCheckpointIO
    # submits, then checks): step 4's own save when the IO thread failed it before that check
    # (seen under load in CI), else step 6's, with step 8 written too when the IO thread was slow
    # to fail. Whatever the timing, exactly the steps whose files were written are reported.
    steps = reported_steps(sqs, pipeline_queues, expect=2 if use_async else 1)
    written = sorted(int(p.stem.removeprefix("step=")) for p in (tmp_path / "ckpt").glob("*.ckpt"))
    assert steps == written
    assert steps in ([[2], [2, 6], [2, 6, 8]] if use_async else [[2]])


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_only_the_first_file_of_a_step_is_reported_not_save_lasts_copy(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, use_async: bool
) -> None:
    # GIVEN ModelCheckpoint(save_last=True): at each checkpoint step also a last.ckpt copy
    io = GatedIO()
    reporting = reporting_for(pipeline_queues, tmp_path, io)
    plugin: Any = (
        AsyncCheckpointIO(reporting.checkpoint_io) if use_async else reporting.checkpoint_io
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=8,
        callbacks=[
            ModelCheckpoint(
                dirpath=tmp_path / "ckpt",
                every_n_train_steps=2,
                save_top_k=-1,
                save_last=True,
                filename="{step}",
            ),
            reporting,
        ],
        plugins=[plugin],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyRegression(tmp_path, 0.0), train_dataloaders=data())
    assert (tmp_path / "ckpt" / "last.ckpt").exists()
    # THEN each step is reported once, naming its own file, never the overwritten last.ckpt
    bodies = [json.loads(m["Body"]) for m in drain(sqs, pipeline_queues.queue_url, expect=4)]
    assert sorted((b["step"], Path(unquote(urlparse(b["uri"]).path)).name) for b in bodies) == [
        (step, f"step={step}.ckpt") for step in (2, 4, 6, 8)
    ]


def test_strategies_and_wirings_that_would_report_wrongly_are_refused(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    class ShardedSave(SingleDeviceStrategy):
        def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            pass  # as FSDP/DeepSpeed do: its own way, not through CheckpointIO

    reporting = reporting_for(pipeline_queues, tmp_path, GatedIO())
    with pytest.raises(IntegrationError, match="strategy"):
        pl.Trainer(
            accelerator="cpu",
            strategy=ShardedSave(device=torch.device("cpu")),
            callbacks=[reporting],
            plugins=[reporting.checkpoint_io],
            max_steps=1,
            logger=False,
        ).fit(TinyRegression(tmp_path, 0.0), train_dataloaders=data())
    with pytest.raises(IntegrationError, match="plugins"):
        pl.Trainer(accelerator="cpu", callbacks=[reporting], max_steps=1, logger=False).fit(
            TinyRegression(tmp_path, 0.0), train_dataloaders=data()
        )
    with pytest.raises(IntegrationError, match="AsyncCheckpointIO"):
        ReportingCheckpointIO(reporting, AsyncCheckpointIO())
    # DeepSpeed whose checkpoint engine writes after save_checkpoint returns
    background = DeepSpeedStrategy(config={"checkpoint": {"writer": {"type": "fast"}}})
    with pytest.raises(IntegrationError, match=r"checkpoint\.writer"):
        save_layout(background)
    assert save_layout(DeepSpeedStrategy(config={"zero_optimization": {"stage": 2}})) == "deepspeed"
    assert reporting.reporter is None  # nothing was opened


def test_the_client_imports_no_lightning_and_the_integration_names_its_extra() -> None:
    # GIVEN an interpreter where lightning cannot be imported (as in the base install)
    code = (
        "import sys; sys.modules['lightning'] = None\n"
        "import trainer_client, trainer_client.integrations, trainer_client.restart.lookup\n"
        "from trainer_client.exceptions import ExtraMissing\n"
        "try:\n"
        "    import trainer_client.integrations.lightning\n"
        "except ExtraMissing as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    # THEN the client imports, and the integration's import says which extra it needs
    assert "pip install 'ckpt-pipeline[lightning]'" in done.stdout, done.stderr
