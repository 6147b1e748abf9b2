"""A Lightning job of two ranks saving sharded checkpoints on CPU (gloo), reported through
CheckpointReporting; resumes through ``reporting.resume()`` when told to.

Usage: ``python -m tests.integrations.lightning_sharded_job '<json options>'`` with
``strategy``: ``model_parallel`` (FSDP2 through ``ModelParallelStrategy``: the DCP layout that
``FSDPStrategy`` sharded also writes), ``deepspeed`` (ZeRO ``stage``) or ``fsdp``
(``state_dict_type``; CUDA only); ``accelerator``: ``cpu`` (gloo, the default) or ``cuda``
(NCCL, one GPU per rank). Lightning refuses DeepSpeed without CUDA in ``setup_environment``;
on CPU :class:`CpuDeepSpeedStrategy` lifts only that check and names the CPU device with an
index, so Lightning's and DeepSpeed's own save and load code run here unchanged (DeepSpeed's CPU
accelerator, gloo).

``kill_rank``/``kill_at_step``: that rank SIGKILLs itself inside the framework's save of that
step, right after writing its own shard (DCP's ``write_data``, DeepSpeed's ZeRO file, rank 0's
one file through CheckpointIO): no rank's save returns, so no rank reports it; the launcher
kills the other rank. ``freeze_sqs_rank``: that rank's SQS requests never leave
(tests/integrations/sqs_gate.py), so every report it made is in its spool when it dies. Each
rank writes ``progress-<rank>.json`` (pid, the step it started from, the loss of each step).
The data of a step is a function of the step, so a resumed run sees exactly what the killed one
saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import (
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    ParallelStrategy,
)
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.utils.data import DataLoader, TensorDataset

from tests.integrations.ranks import fork_ranks
from tests.integrations.sqs_gate import SqsGate
from trainer_client.integrations.lightning import CheckpointReporting
from trainer_client.restart.lookup import next_run_attempt

WORLD_SIZE = 2


class CpuDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy without its CUDA-only check (see the module docstring)."""

    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)

    @property
    def root_device(self) -> torch.device:
        # DeepSpeed's engine reads the device index; CPU's is None.
        return torch.device("cpu", self.local_rank)


class StepRegression(pl.LightningModule):
    """A small MLP; the batch of each step is drawn from the step number and the rank."""

    def __init__(self, progress_path: Path, shard: bool) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        self.progress_path = progress_path
        self.shard = shard
        self.record: dict[str, Any] = {"pid": os.getpid(), "start_step": None, "losses": {}}

    def configure_model(self) -> None:
        if self.shard:
            from torch.distributed.fsdp import fully_shard

            assert self.device_mesh is not None  # ModelParallelStrategy sets it before this hook
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def on_train_start(self) -> None:
        self.record["start_step"] = self.global_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        generator = torch.Generator().manual_seed(1000 * (self.global_step + 1) + self.global_rank)
        x = torch.randn(8, 8, generator=generator).to(self.device)
        loss = torch.nn.functional.mse_loss(self.net(x), x.sum(dim=1, keepdim=True).sin())
        self.log("train_loss", loss)
        self.record["losses"][str(self.global_step + 1)] = loss.item()
        tmp = self.progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record))
        tmp.replace(self.progress_path)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def die_inside_the_save(kill_at_step: int) -> None:
    """SIGKILL this rank right after it wrote its own shard of step ``kill_at_step``.

    Nothing is flushed first: the finisher and the sender work in the background, so the
    earlier checkpoints' reports of this rank (and of the rank the launcher then kills) may
    still be in their spools. The restart's ``reporting.resume()`` sends them before it
    decides."""
    marker = f"step={kill_at_step}.ckpt"

    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    original_write = FileSystemWriter.write_data

    def write_data(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        future = original_write(self, plan, planner)
        if marker in str(self.path):
            future.wait()
            kill()
        return future

    FileSystemWriter.write_data = write_data  # type: ignore[method-assign,assignment]
    from deepspeed.runtime.engine import DeepSpeedEngine

    original_zero = DeepSpeedEngine._save_zero_checkpoint

    def save_zero(self: DeepSpeedEngine, save_path: str, tag: str) -> Any:
        result = original_zero(self, save_path, tag)
        if marker in str(save_path):
            kill()
        return result

    DeepSpeedEngine._save_zero_checkpoint = save_zero  # type: ignore[method-assign]
    original_io = TorchCheckpointIO.save_checkpoint

    def save_file(self: TorchCheckpointIO, checkpoint: Any, path: Any, options: Any = None) -> None:
        original_io(self, checkpoint, path, options)
        if marker in str(path):
            kill()

    TorchCheckpointIO.save_checkpoint = save_file  # type: ignore[method-assign,assignment]


def strategy_for(options: dict[str, Any]) -> ParallelStrategy:
    cuda = options.get("accelerator") == "cuda"
    if options["strategy"] == "model_parallel":
        return ModelParallelStrategy(data_parallel_size=WORLD_SIZE, tensor_parallel_size=1)
    if options["strategy"] == "fsdp":
        return FSDPStrategy(state_dict_type=options["state_dict_type"])
    stage = int(options["stage"])
    deepspeed = DeepSpeedStrategy if cuda else CpuDeepSpeedStrategy
    return deepspeed(
        process_group_backend="nccl" if cuda else "gloo",
        config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        },
    )


def run_rank(rank: int, options: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    if options.get("freeze_sqs_rank") == rank:
        # Every report of this rank stays in its spool until the job dies (the restart sends it).
        gate = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        gate.route_sqs_here()  # before the reporter builds its SQS client
        gate.frozen.set()
    resume_from: str | None = None
    run_attempt: int | None = None
    if options.get("resume"):
        run_attempt = next_run_attempt(
            os.environ["CKPT_JOB_ID"], database_url=options["database_url"]
        )
    reporting = CheckpointReporting(
        run_attempt=run_attempt,
        loss_metric="train_loss",
        tuning={"connect_timeout_s": 0.5, "backoff_cap_s": 0.5, "spot_poll": False},
    )
    if options.get("resume"):
        # The restart's call, before fit(), on a process group of our own making (Lightning
        # and DeepSpeed find it initialised and use it): every rank sends its spool, rank 0
        # waits for the writer to store it and decides for every rank.
        cuda = options.get("accelerator") == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        resume_from = reporting.resume(database_url=options["database_url"])
    if options.get("kill_rank") == rank:
        die_inside_the_save(options["kill_at_step"])
    trainer = pl.Trainer(
        accelerator=options.get("accelerator", "cpu"),
        devices=WORLD_SIZE,
        strategy=strategy_for(options),
        max_steps=options["max_steps"],
        max_epochs=-1,
        callbacks=[
            ModelCheckpoint(
                dirpath=options["ckpt_dir"],
                every_n_train_steps=options["every_n_steps"],
                save_top_k=-1,
                filename="{step}",
            ),
            reporting,
        ],
        # One-file saves (FSDP's full state dict) go through the reporting IO.
        plugins=[reporting.checkpoint_io] if options.get("state_dict_type") == "full" else None,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = StepRegression(
        Path(options["progress_dir"], f"progress-{rank}.json"),
        shard=options["strategy"] == "model_parallel",
    )
    # The batches' content is unused (training_step draws its own): a long dummy loader.
    loader: DataLoader[tuple[torch.Tensor, ...]] = DataLoader(
        TensorDataset(torch.zeros(10_000, 1)), batch_size=1
    )
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume_from)
    return 0


if __name__ == "__main__":
    job_options = json.loads(sys.argv[1])
    sys.exit(fork_ranks(WORLD_SIZE, lambda rank: run_rank(rank, job_options)))
