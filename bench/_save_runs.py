"""One training run per (framework, size, mode) for ``bench.save_overhead``, timed per save and
per step (modes and figures: BENCHMARKS.md §8)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._probe import State, StepClock, Trace
from bench._steps import Cadence, StepRatio, step_ratio
from bench._writeback import CONTROLS, KernelWriteBack
from trainer_client import CheckpointReporter, FinishOutcome

REPORTING = ("finish", "finish+sha")
MODES = ("none", *REPORTING, *CONTROLS)
SEQ = 64
# Steps a run may take at most (a finisher that never goes idle must not hang the bench).
MAX_STEPS = 200_000


@dataclass
class SaveRun:
    """The timings of one run."""

    framework: str
    mode: str
    device: str
    ckpt_bytes: int = 0
    framework_s: list[float] = field(default_factory=list)
    ours_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    finish_call_s: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    phases: list[Mapping[str, float]] = field(default_factory=list)  # FinishOutcome.seconds
    steps: list[tuple[float, bool]] = field(default_factory=list)  # (seconds, finisher busy)
    traces: list[Trace] = field(default_factory=list)  # per step, bench._probe
    dirty_at_save: list[int] = field(default_factory=list)  # controls: bytes left dirty by a save
    files: dict[int, list[Path]] = field(default_factory=dict)  # step -> files on disk
    roots: dict[int, Path] = field(default_factory=dict)  # step -> what rotation removes
    removed: dict[int, int] = field(default_factory=dict)  # step -> bytes of a rotated save
    own_s: float | None = None  # the disk's own fsync (+ hash) of the last checkpoint's bytes
    own_phases: tuple[float, float] = (0.0, 0.0)  # of which (fsync, hash)
    bound_waits: int = 0  # saves that waited at the max_finishing bound (stats.finish_waits)

    def step_ratio(self) -> StepRatio | None:
        """Busy over idle step, interleaved windows (``bench._steps``)."""
        return step_ratio(self.steps)


@dataclass(frozen=True)
class Plan:
    """How a run saves: ``saves`` times; with ``cadence`` each save once the finisher has been
    idle as many steps as it was busy (at least ``min_idle``), else every ``every`` steps;
    ``model``: ``ballast``, a small model whose checkpoint is brought to size by a persistent
    buffer (short steps, many of them per window); ``sized``, a GPT-2 of the checkpoint's size
    (the done check); ``gpt2-medium`` (HF only: 354 M parameters, ~4.25 GB with AdamW,
    bench/gpu_save_overhead.sh; Lightning takes ``sized``); ``tuning``: the reporter's knobs."""

    saves: int
    every: int = 2
    cadence: bool = False
    min_idle: int = 20
    model: str = "ballast"
    tuning: dict[str, Any] = field(default_factory=dict)
    keep: int = 0  # checkpoints kept on disk (the oldest removed before a save); 0: all

    def rotate(self, run: SaveRun, reporter: CheckpointReporter | None) -> None:
        """Before a save: remove the oldest checkpoints so that ``keep`` remain after it, as
        ``save_total_limit`` would (55 cycles at 1 GB need 55 GB otherwise). Only finished ones
        (a rotated file is a dropped report); their sizes stay for the report check. Called on
        the training thread between a step's end and the save: in neither's time."""
        if not self.keep or (reporter is not None and reporter.stats.finishing):
            return
        for step in sorted(run.files)[: max(0, len(run.files) - self.keep + 1)]:
            files = run.files.pop(step)
            run.removed[step] = sum(p.stat().st_size for p in files)
            root = run.roots.pop(step, None)
            if root is not None and root.is_dir():
                shutil.rmtree(root)
            for p in files:
                p.unlink(missing_ok=True)

    def clock(self) -> Cadence | None:
        """A fresh cadence for one run (None: fixed steps)."""
        return Cadence(self.saves, self.min_idle) if self.cadence else None


def instrument(reporter: CheckpointReporter, run: SaveRun) -> None:
    """Time each ``finish()`` call and its background finish (bench-only instance wrapper)."""
    original = reporter.finish

    def finish(*args: Any, **kwargs: Any) -> Future[FinishOutcome]:
        start = time.perf_counter()
        future = original(*args, **kwargs)
        returned = time.perf_counter()
        run.finish_call_s.append(returned - start)
        run.bound_waits = reporter.stats.finish_waits

        def done(f: Future[FinishOutcome]) -> None:
            run.finish_s.append(time.perf_counter() - returned)
            run.outcomes.append(f.result().status)
            run.phases.append(f.result().seconds)

        future.add_done_callback(done)
        return future

    reporter.finish = finish  # type: ignore[method-assign]


def reporter(
    queue_url: str, spool: Path, job_id: str, tuning: dict[str, Any]
) -> CheckpointReporter:
    """A rank-0, world-1 reporter for one run."""
    return CheckpointReporter(
        queue_url, job_id=job_id, spool_dir=spool, rank=0, world_size=1, run_attempt=0,
        install_signal_handler=False, spot_poll=False, close_timeout_s=600.0, **tuning,
    )  # fmt: skip


def _busy(rep: CheckpointReporter | None) -> bool:
    return rep is not None and rep.stats.finishing > 0


def control_watch(mode: str) -> KernelWriteBack | None:
    """The kernel's write-back to follow in a control mode (None in the others)."""
    return KernelWriteBack(now=mode == "control-now") if mode in CONTROLS else None


def step_clock(
    run: SaveRun, watch: KernelWriteBack | None, reporter: Callable[[], CheckpointReporter | None]
) -> StepClock:
    """The run's step clock: busy while the kernel writes the save back (controls) or while the
    finisher works (the others). Make it on the training thread (its probe reads that one)."""

    def state() -> State:
        if watch is not None:
            return watch.state()
        return "busy" if _busy(reporter()) else "idle"

    return StepClock(run.steps, run.traces, state)


def end_step(clock: StepClock, cadence: Cadence | None, device: str) -> str:
    """End a training step on ``clock`` (after CUDA's queued work) and return what the cadence
    asks of it: ``"save"``, ``"stop"`` or ``""`` (always ``""`` without a cadence)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    now = clock.end()
    if cadence is None:
        return ""
    return cadence.after_step(now == "busy", waiting=now == "waiting")


def end_watch(run: SaveRun, watch: KernelWriteBack | None) -> None:
    """Keep what the control saw, and stop following the files."""
    if watch is not None:
        run.dirty_at_save = watch.dirty_at_save
        watch.close()


def _tokens(n: int, vocab: int) -> Any:
    import torch

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, vocab, (SEQ,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    return Tokens()


def gpt2_shape(target_bytes: int) -> tuple[int, int]:
    """(n_embd, n_layer) of a GPT-2 whose HF checkpoint (fp32 weights + AdamW's two moments,
    12 bytes per parameter) is about ``target_bytes``."""
    params = target_bytes / 12
    vocab, per_layer = 50257 + 1024, 12
    if params > 110e6:
        embd = 1536
        return embd, max(1, round((params - vocab * embd) / (per_layer * embd * embd)))
    embd = 8  # a multiple of the 8 heads
    while vocab * (embd + 8) + per_layer * (embd + 8) ** 2 <= params:
        embd += 8
    return embd, 1


def ballast_buffer(size: int) -> Any:
    """A persistent buffer of about ``size`` bytes (float32 noise): saved, never computed on."""
    import torch

    return torch.randn(max(1, size // 4), generator=torch.Generator().manual_seed(0))


def run_hf(
    size: int, mode: str, out: Path, queue_url: str, *, device: str, plan: Plan, workers: int
) -> SaveRun:
    """The HF ``Trainer`` (GPT-2 from its config, or a tiny one with ballast)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback
    from transformers import TrainingArguments as Args

    from trainer_client.integrations.huggingface import CheckpointReporterCallback

    run = SaveRun("hf", mode, device)
    rep = reporter(
        queue_url, out / "spool", f"bench-hf-{mode.replace('+', '-')}-{size}", plan.tuning
    )
    instrument(rep, run)
    cadence = plan.clock()
    watch = control_watch(mode)
    clock = step_clock(run, watch, lambda: rep)

    class Timed(CheckpointReporterCallback):
        def on_save(self, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            super().on_save(*args, **kwargs)
            run.ours_s.append(time.perf_counter() - start)

    class HFClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            action = end_step(clock, cadence, device)
            control.should_save = control.should_save or action == "save"
            # Only ever set: clearing it would undo the Trainer's own stop at max_steps.
            if action == "stop" or state.global_step >= MAX_STEPS:
                control.should_training_stop = True

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            directory = out / "hf" / f"checkpoint-{state.global_step}"
            files = sorted(p for p in directory.rglob("*") if p.is_file())
            run.files[state.global_step], run.roots[state.global_step] = files, directory
            if watch is not None:
                watch.saved(files)

    class TimedTrainer(Trainer):  # type: ignore[misc]
        def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            plan.rotate(run, rep)
            start = time.perf_counter()
            super()._save_checkpoint(*args, **kwargs)
            run.framework_s.append(time.perf_counter() - start)

    torch.manual_seed(0)
    if plan.model == "gpt2-medium":
        config = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=SEQ, use_cache=False)
        model = GPT2LMHeadModel(config)
    elif plan.model == "sized":
        embd, layers = gpt2_shape(size)
        config = GPT2Config(n_embd=embd, n_layer=layers, n_head=8, n_positions=SEQ, use_cache=False)
        model = GPT2LMHeadModel(config)
    else:
        config = GPT2Config(n_embd=64, n_layer=2, n_head=8, n_positions=SEQ, vocab_size=1024)
        model = GPT2LMHeadModel(config)
        model.register_buffer("ballast", ballast_buffer(size), persistent=True)
    callbacks: list[Any] = [HFClock()]
    if mode in REPORTING:
        callbacks.append(Timed(reporter=rep, checksums=mode == "finish+sha"))
    args = Args(
        output_dir=str(out / "hf"), use_cpu=device == "cpu", bf16=device == "cuda",
        per_device_train_batch_size=2 if device == "cpu" else 16,
        max_steps=MAX_STEPS if cadence is not None else plan.every * plan.saves,
        save_strategy="no" if cadence is not None else "steps", save_steps=plan.every,
        report_to=[], disable_tqdm=True, logging_steps=50, dataloader_num_workers=workers,
    )  # fmt: skip
    trainer = TimedTrainer(
        model=model, args=args, train_dataset=_tokens(MAX_STEPS * 2, config.vocab_size),
        callbacks=callbacks,
    )  # fmt: skip
    trainer.train()
    rep.close(timeout=600)
    end_watch(run, watch)
    run.ckpt_bytes = sum(p.stat().st_size for p in run.files[max(run.files)])
    return run


Runner = Callable[..., SaveRun]
