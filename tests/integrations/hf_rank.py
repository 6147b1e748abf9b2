"""One rank of a real Hugging Face ``Trainer`` job on CPU (gloo), reporting through the callback.

Launched by tests/integrations/hf_job.py as ``python -m tests.integrations.hf_rank JSON``
with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun would. The model is a 1-layer GPT-2
built from its configuration (no downloads), the data a fixed tensor dataset.

``kill_rank``/``kill_at_save``: that rank SIGKILLs itself in ``on_save`` of that step, after its
``_save_checkpoint`` wrote its files and before the reporting callback (which runs after this
one) reported them: the checkpoint then exists on disk but must never count as complete.
``kill_after_report_at_save``: SIGKILL in ``on_save`` of that step *after* the reporting
callback's ``on_save`` returned (its finish job is on disk, not yet finished).
``hold_dir``: every checkpoint is held in the finisher until the test releases it
(tests/trainer_client/holds.py).
``upload_to``: the callback's S3 upload option (``s3://bucket/prefix``).
``raise_at_step``: ``train()`` raises at that step; the ``finally`` still closes the reporter.
``resume``: process 0 asks the database for the latest complete checkpoint and broadcasts it, so
every rank resumes from the same one even if a late report lands between two queries.
``restart``: every process makes the restart's one collective call (the callback's ``resume()``:
send what the spool holds, wait for it to be written, agree, restore from S3 to this node).
``freeze_sqs_kill_rank``/``freeze_sqs_kill_at_save``: that rank's SQS requests go through a relay
(tests/integrations/sqs_gate.py) that it freezes in ``on_save`` of that step before the
reporting callback runs; once the checkpoint is finished (uploaded) and its report spooled, the
process SIGKILLs itself: the report is durable in the spool and never sent.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from tests.integrations.sqs_gate import SqsGate
from tests.trainer_client.holds import HoldUntilReleased, hold
from trainer_client.integrations.huggingface import CheckpointReporterCallback
from trainer_client.restart.lookup import latest_complete_checkpoint

VOCAB = 64
SEQ = 8


class TinyData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Fixed token sequences; labels = inputs (causal LM loss)."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class KillAtSave(TrainerCallback):  # type: ignore[misc]
    """SIGKILL this process in ``on_save`` of one step (before the reporter's ``on_save``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class FreezeSqsAtSave(TrainerCallback):  # type: ignore[misc]
    """In ``on_save`` of one step (before the reporter's): deliver the earlier checkpoints'
    reports (so that only this step's is held back, not a slow finisher's older one), then
    freeze this process's SQS relay."""

    def __init__(self, gate: SqsGate, callback: CheckpointReporterCallback, step: int) -> None:
        self.gate, self.callback, self.step = gate, callback, step

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.step:
            assert self.callback.reporter is not None
            if not self.callback.reporter.flush(60):
                raise RuntimeError("earlier reports not delivered within 60 s")
            self.gate.frozen.set()


class KillWhenSpooled(TrainerCallback):  # type: ignore[misc]
    """In ``on_save`` of one step (after the reporter's): wait until the finisher has spooled
    the step's report (nothing finishing, one report pending), then SIGKILL this process."""

    def __init__(self, callback: CheckpointReporterCallback, step: int) -> None:
        self.callback, self.step = callback, step

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step != self.step:
            return
        reporter = self.callback.reporter
        assert reporter is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = reporter.stats
            if stats.finishing == 0 and stats.pending >= 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.01)
        raise RuntimeError(f"step {self.step}'s report was not spooled within 60 s")


class RaiseAtStep(TrainerCallback):  # type: ignore[misc]
    """Make ``train()`` raise at the end of one step (a crash the process survives)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.step:
            raise RuntimeError(f"training failed at step {self.step}")


class StepLog(TrainerCallback):  # type: ignore[misc]
    """The global steps this process trained (to show where a resumed run started), and the
    loss logged at each, kept in ``path`` after every log (a killed process leaves it too)."""

    def __init__(self, path: Path) -> None:
        self.steps: list[int] = []
        self.losses: dict[str, float] = {}
        self.path = path

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.steps.append(int(state.global_step))

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        logs = kw.get("logs") or {}
        if "loss" in logs:
            self.losses[str(state.global_step)] = float(logs["loss"])
            self.path.write_text(json.dumps(self.losses))


def _deepspeed(stage: int | None) -> dict[str, Any]:
    """TrainingArguments for DeepSpeed ZeRO ``stage`` on CPU (its CPU accelerator, gloo)."""
    if stage is None:
        return {}
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": stage},
        # DeepSpeed's fused CPU Adam needs a compiler; torch's AdamW is the same optimizer.
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
    }
    return {"deepspeed": config}


def _fsdp(config: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingArguments for accelerate's FSDP (``version``, ``state_dict_type``): CUDA only."""
    if config is None:
        return {}
    return {
        "fsdp": True,
        "fsdp_config": {**config, "transformer_layer_cls_to_wrap": ["GPT2Block"]},
    }


def main(options: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    args = TrainingArguments(
        output_dir=options["output_dir"],
        use_cpu=not options.get("cuda"),
        ddp_backend="nccl" if options.get("cuda") else "gloo",
        per_device_train_batch_size=2,
        max_steps=options["max_steps"],
        save_strategy="steps",
        save_steps=options["save_steps"],
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        **_deepspeed(options.get("deepspeed_stage")),
        **_fsdp(options.get("fsdp")),
    )
    # process_index/world_size come from accelerate's state, which initialises the gloo group.
    assert args.world_size == int(os.environ["WORLD_SIZE"]) and args.process_index == rank
    gate: SqsGate | None = None
    if options.get("freeze_sqs_kill_rank") == rank:
        gate = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        gate.route_sqs_here()
    hold_dir = options.get("hold_dir")
    reporter = CheckpointReporterCallback(
        checksums=bool(options.get("checksums")),
        install_signal_handler=False,
        spot_poll=False,
        post=[hold(Path(hold_dir))] if hold_dir else [],
        post_steps=[HoldUntilReleased()],
        upload_to=options.get("upload_to"),
    )
    resume_from: str | None = None
    restart: dict[str, Any] = {}
    if options.get("restart"):
        resume_from = reporter.resume(args, deadline_s=options.get("deadline_s", 60.0))
        if reporter.resumed is not None:
            restart = {"step": reporter.resumed.step, "source": reporter.resumed.source}
    if options.get("resume"):
        found: list[str | None] = [None]
        if rank == 0:
            point = latest_complete_checkpoint(
                os.environ["CKPT_JOB_ID"], database_url=os.environ["CKPT_RESUME_DATABASE_URL"]
            )
            found = [point.path if point else None]
        dist.broadcast_object_list(found, src=0)
        resume_from = found[0]

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, use_cache=False
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    steps = StepLog(Path(options["result_dir"], f"losses-{rank}-attempt-{attempt}.json"))
    callbacks: list[TrainerCallback] = [steps]
    if options.get("kill_rank") == rank:
        callbacks.append(KillAtSave(options["kill_at_save"]))
    if options.get("raise_at_step") is not None:
        callbacks.append(RaiseAtStep(options["raise_at_step"]))
    if gate is not None:
        callbacks.append(FreezeSqsAtSave(gate, reporter, options["freeze_sqs_kill_at_save"]))
    callbacks.append(reporter)  # after KillAtSave: the kill lands between the write and report
    if gate is not None:
        callbacks.append(KillWhenSpooled(reporter, options["freeze_sqs_kill_at_save"]))
    if options.get("kill_after_report_at_save") is not None:
        callbacks.append(KillAtSave(options["kill_after_report_at_save"]))
    trainer = Trainer(model=model, args=args, train_dataset=TinyData(64), callbacks=callbacks)
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    finally:
        reporter.close()
    result = {
        "rank": rank,
        "resumed_from": resume_from,
        "restart": restart,
        "steps": steps.steps,
        "reported_steps": reporter.reported_steps,
        "failures": reporter.failures,
    }
    Path(options["result_dir"], f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
