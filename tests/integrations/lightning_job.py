"""A tiny Lightning job of two ranks: DDP over gloo on CPU, ModelCheckpoint every few steps, every
checkpoint reported through CheckpointReporting; resumes from the database when told to.

Usage: ``python lightning_job.py '<json options>'``. This process is the job's launcher, in the
manner of torchrun: it forks one process per rank with torchrun's environment contract (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which Lightning takes as externally launched,
and when a rank dies it SIGKILLs the rest. It forks *after* importing torch and Lightning, so the
ranks do not import them again: on a shared 2-core machine that import is most of the run time.
The reporter's queue, job id and spool come from the environment (CKPT_QUEUE_URL, CKPT_JOB_ID,
CKPT_SPOOL_DIR). Each rank writes ``progress-<rank>.json`` (pid, the step fit() started at, the
global step after each batch); with ``restart`` every rank initialises the gloo process group
(Lightning then uses it), makes the restart's call (``reporting.resume()``: one decision, rank 0's,
broadcast) and writes what it decided to ``restart-<rank>.json``. ``restart_count`` is torchrun's
TORCHELASTIC_RESTART_COUNT (the reports' ``run_attempt``).

``freeze_sqs_kill_rank``/``freeze_sqs_kill_at_step``: that rank's SQS requests go through a relay
(tests/integrations/sqs_gate.py) that it freezes just before the save of that step (earlier
reports delivered first); once the save returned and the step's report is spooled, and rank 0's
report of the step is in the database, the rank SIGKILLs itself: its report is durable in its
spool and never sent, and the launcher kills the rest of the job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

from tests.integrations.ranks import fork_ranks
from tests.integrations.sqs_gate import SqsGate, shard_stored
from trainer_client.integrations.lightning import CheckpointReporting
from trainer_client.restart.lookup import latest_complete_checkpoint, next_run_attempt


class TinyRegression(pl.LightningModule):
    """A linear model on a fixed random regression problem; records its progress per rank."""

    def __init__(self, progress_dir: Path, pause_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.progress_dir = progress_dir
        self.pause_s = pause_s
        self.start_step: int | None = None
        self._pace = threading.Event()
        # Called after every batch, once the callbacks' hooks (ModelCheckpoint's save) ran.
        self.after_batch: Callable[[int], None] | None = None

    def _progress(self) -> None:
        rank = self.trainer.global_rank
        path = self.progress_dir / f"progress-{rank}.json"
        tmp = path.with_suffix(".tmp")
        state = {"pid": os.getpid(), "start_step": self.start_step, "step": self.global_step}
        tmp.write_text(json.dumps(state))
        tmp.replace(path)  # the test reads whole files only

    def on_train_start(self) -> None:
        self.start_step = self.global_step
        self._progress()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self._pace.wait(self.pause_s)  # the pace of training, so a kill lands mid-run
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._progress()
        if self.after_batch is not None:
            self.after_batch(self.global_step)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)


class FreezeSqsAtStep(Callback):
    """Before the save of ``step`` (callbacks run before ModelCheckpoint, which Lightning orders
    last): deliver the earlier checkpoints' reports, then freeze this rank's SQS relay."""

    def __init__(self, gate: SqsGate, reporting: CheckpointReporting, step: int) -> None:
        self.gate, self.reporting, self.step = gate, reporting, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            assert self.reporting.reporter is not None
            if not self.reporting.reporter.flush(60):
                raise RuntimeError("earlier reports not delivered within 60 s")
            self.gate.frozen.set()


def kill_when_spooled(
    reporting: CheckpointReporting, step: int, database_url: str
) -> Callable[[int], None]:
    """After the save of ``step`` returned: once this rank's report of it is spooled (nothing
    finishing, one report pending) and rank 0's is in the database, SIGKILL this process."""

    def after_batch(global_step: int) -> None:
        if global_step != step:
            return
        reporter = reporting.reporter
        assert reporter is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = reporter.stats
            if stats.finishing == 0 and stats.pending >= 1 and shard_stored(database_url, step, 0):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.2)
        raise RuntimeError(f"step {step}: report not spooled or rank 0's not stored in 120 s")

    return after_batch


def run_rank(options: dict[str, Any]) -> int:
    """One rank's fit(), in a process whose environment says which rank it is."""
    torch.set_num_threads(1)
    if "restart_count" in options:
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(options["restart_count"])
    rank = int(os.environ["RANK"])
    gate: SqsGate | None = None
    if options.get("freeze_sqs_kill_rank") == rank:
        gate = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        gate.route_sqs_here()  # before the reporter builds its SQS client
    resume_from: str | None = None
    run_attempt: int | None = None
    if options.get("resume"):
        # Every rank asks before fit(): none can report before all reach DDP's first collective.
        job_id = os.environ["CKPT_JOB_ID"]
        point = latest_complete_checkpoint(job_id, database_url=options["database_url"])
        resume_from = None if point is None else point.path
        run_attempt = next_run_attempt(job_id, database_url=options["database_url"])
    # A test's way to make the ranks disagree (what a race between two questions could do).
    resume_from = options.get("ckpt_path_by_rank", {}).get(os.environ["RANK"], resume_from)
    reporting = CheckpointReporting(
        run_attempt=run_attempt,
        loss_metric="train_loss",
        upload_to=options.get("upload_to"),
        tuning={"connect_timeout_s": 0.5, "backoff_cap_s": 0.5, "spot_poll": False},
    )
    if options.get("restart"):
        # The restart's call, before fit(), on a process group of our own making (Lightning
        # finds it initialised and uses it): rank 0 decides for every rank.
        dist.init_process_group("gloo")
        resume_from = reporting.resume(database_url=options["database_url"])
        resumed = reporting.resumed
        restart = {"step": resumed.step, "source": resumed.source} if resumed else None
        Path(options["progress_dir"], f"restart-{os.environ['RANK']}.json").write_text(
            json.dumps({"restart": restart, "path": resume_from})
        )
    io: Any = reporting.checkpoint_io
    if options.get("async_io"):
        io = AsyncCheckpointIO(io)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=options.get("world", WORLD_SIZE),
        strategy="ddp",
        max_steps=options["max_steps"],
        max_epochs=-1,
        callbacks=[
            *(
                [FreezeSqsAtStep(gate, reporting, options["freeze_sqs_kill_at_step"])]
                if gate
                else []
            ),
            ModelCheckpoint(
                dirpath=options["ckpt_dir"],
                every_n_train_steps=options["every_n_steps"],
                save_top_k=-1,  # keep every file: the test checks each reported one
                filename="{step}",
            ),
            reporting,
        ],
        plugins=[io],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = TinyRegression(Path(options["progress_dir"]), options["pause_s"])
    if gate is not None:
        model.after_batch = kill_when_spooled(
            reporting, options["freeze_sqs_kill_at_step"], options["database_url"]
        )
    trainer.fit(model, train_dataloaders=data(), ckpt_path=resume_from)
    return 0


WORLD_SIZE = 2


def launch(options: dict[str, Any]) -> int:
    """Fork the ranks; wait; if one fails, SIGKILL the others (a survivor would hang in gloo)."""
    return fork_ranks(options.get("world", WORLD_SIZE), lambda rank: run_rank(options))


if __name__ == "__main__":
    sys.exit(launch(json.loads(sys.argv[1])))
