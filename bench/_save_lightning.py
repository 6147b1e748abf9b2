"""Lightning's run for ``bench.save_overhead`` (sync and ``AsyncCheckpointIO``): the same
cycles, clock and modes as the other frameworks' runs (``bench._save_runs``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bench._probe import StepClock
from bench._save_runs import (
    MAX_STEPS,
    REPORTING,
    Plan,
    SaveRun,
    ballast_buffer,
    control_watch,
    end_step,
    end_watch,
    instrument,
    step_clock,
)  # fmt: skip
from bench._steps import Cadence
from bench._writeback import KernelWriteBack
from trainer_client import CheckpointReporter
from trainer_client.config import TuningKnobs


def run_lightning(
    size: int, mode: str, out: Path, queue_url: str, *, device: str, plan: Plan, workers: int,
    asynchronous: bool,
) -> SaveRun:  # fmt: skip
    """Lightning: a stack of Linear layers and AdamW (or one small layer and ballast), saved
    by ``ModelCheckpoint`` every ``plan.every`` steps or by the cadence."""
    import lightning.pytorch as pl
    import torch
    from lightning.fabric.plugins import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins import AsyncCheckpointIO

    from trainer_client.integrations.lightning import CheckpointReporting

    name = "lightning-async" if asynchronous else "lightning"
    run = SaveRun(name, mode, device)
    ballast = plan.model == "ballast"
    width = 256 if ballast else 2048
    layers = 1 if ballast else max(1, round(size / (12 * width * width)))
    cadence = plan.clock()
    watch = control_watch(mode)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
            if ballast:
                self.register_buffer("ballast", ballast_buffer(size), persistent=True)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class TimedIO(TorchCheckpointIO):
        def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            super().save_checkpoint(*args, **kwargs)
            run.framework_s.append(time.perf_counter() - start)

    # close_timeout_s: long enough for every finish to complete: the bench measures them all (a
    # job still running at the deadline would be left for a next start that never comes here).
    knobs = {"install_signal_handler": False, "spot_poll": False, "close_timeout_s": 600.0}
    reporting = CheckpointReporting(
        queue_url=queue_url, job_id=f"bench-{name}-{mode.replace('+', '-')}-{size}",
        spool_dir=out / "spool", run_attempt=0, checksums=mode == "finish+sha",
        checkpoint_io=TimedIO(), tuning=cast(TuningKnobs, knobs | plan.tuning),
    )  # fmt: skip
    clock = step_clock(run, watch, lambda: reporting.reporter)
    step_saver = _clock(
        run, plan, device, cadence, out / "pl", clock, watch, lambda: reporting.reporter
    )

    class ReportingClock(step_saver):  # type: ignore[valid-type,misc]
        def setup(self, trainer: Any, module: Any, stage: str) -> None:
            # After the reporting callback's setup: its reporter exists now.
            if reporting.reporter is not None:
                instrument(reporting.reporter, run)
            original = reporting.saved

            def saved(*args: Any, **kwargs: Any) -> None:
                start = time.perf_counter()
                original(*args, **kwargs)
                run.ours_s.append(time.perf_counter() - start)

            reporting.saved = saved  # type: ignore[method-assign]

    io: Any = reporting.checkpoint_io if mode in REPORTING else TimedIO()
    callbacks: list[Any] = []
    if cadence is None:
        callbacks.append(
            ModelCheckpoint(dirpath=out / "pl", every_n_train_steps=plan.every, save_top_k=-1)
        )
    if mode in REPORTING:
        callbacks += [reporting, ReportingClock()]
    else:
        callbacks.append(step_saver())
    trainer = pl.Trainer(
        max_steps=MAX_STEPS if cadence is not None else plan.every * plan.saves,
        accelerator=device, devices=1, callbacks=callbacks,
        plugins=[AsyncCheckpointIO(io) if asynchronous else io], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=cadence is None,
    )  # fmt: skip
    data = torch.utils.data.TensorDataset(torch.randn(4096, width))
    loader = torch.utils.data.DataLoader(
        data, batch_size=8, num_workers=workers, persistent_workers=workers > 0
    )
    trainer.fit(Model(), train_dataloaders=loader)
    end_watch(run, watch)
    if cadence is None:
        for path in sorted((out / "pl").glob("*.ckpt")):
            run.files[(len(run.files) + 1) * plan.every] = [path]
    run.ckpt_bytes = max(p.stat().st_size for ps in run.files.values() for p in ps)
    return run


def _clock(
    run: SaveRun, plan: Plan, device: str, cadence: Cadence | None, directory: Path,
    clock: StepClock, watch: KernelWriteBack | None,
    reporter: Callable[[], CheckpointReporter | None],
) -> Any:  # fmt: skip
    """Lightning's step clock (a callback class): ends each step on ``clock`` and saves when the
    cadence asks, rotating the oldest checkpoints away first (``reporter`` None: no reporting)."""
    import lightning.pytorch as pl

    class Clock(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            clock.begin()

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            action = end_step(clock, cadence, device)
            if action == "save":
                path = directory / f"step-{trainer.global_step}.ckpt"
                plan.rotate(run, reporter())
                trainer.save_checkpoint(path)
                run.files[trainer.global_step] = [path]
                if watch is not None:
                    watch.saved([path])
            if action == "stop" or trainer.global_step >= MAX_STEPS:
                trainer.should_stop = True

    return Clock
