"""A plain-torch job of two ranks: FSDP2 (``fully_shard``) over gloo on CPU, a DCP checkpoint every
few steps (``dcp.save`` or ``dcp.async_save``), each rank's part reported through
``trainer_client.integrations.dcp``; resumes from the database when told to.

Usage: ``python -m tests.integrations.dcp_job '<json options>'`` (reporter settings from the
environment: CKPT_QUEUE_URL, CKPT_JOB_ID, CKPT_SPOOL_DIR). Each rank writes ``progress-<rank>.json``
(pid, the step it started from, the loss of every step it trained) after every step.

``kill_rank``/``kill_at_step``: that rank SIGKILLs itself inside DCP's save of that step, right
after its own shard file is written and before the coordinator gathers the ranks' results: the
shards are on disk, ``.metadata`` never is, and no rank's save returns.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import async_save, save
from torch.distributed.fsdp import fully_shard

from tests.integrations.ranks import fork_ranks
from trainer_client import CheckpointReporter
from trainer_client.integrations.dcp import report_dcp_saved, report_dcp_when_saved
from trainer_client.integrations.resume import latest_complete_checkpoint, next_run_attempt

WORLD_SIZE = 2


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one step on one rank: a function of both, so a resumed run sees the same."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def die_inside_the_save(kill_at_step: int, reporter: CheckpointReporter) -> None:
    """Make this rank SIGKILL itself in DCP's write of ``kill_at_step``, after its shard.

    The earlier checkpoints' reports are delivered first: the finisher and the sender work in
    the background, and a kill a few milliseconds after the previous save would otherwise leave
    that save's report in this rank's spool (sent by the next start, after the resume has
    already asked) on a busy machine, making "the previous complete checkpoint" a race."""
    original = FileSystemWriter.write_data

    def write_data(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        future = original(self, plan, planner)
        # Known by the directory: an async save writes while the loop has moved on.
        if Path(self.path).name == f"step-{kill_at_step}":
            future.wait()
            if not reporter.flush(timeout=60):
                raise RuntimeError("the earlier checkpoints' reports were not delivered")
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_data  # type: ignore[method-assign,assignment]


def run_rank(rank: int, options: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    job_id = os.environ["CKPT_JOB_ID"]
    found: list[Any] = [None, 0]
    if options.get("resume") and rank == 0:
        # Rank 0 asks and tells the others: every rank resumes from the same checkpoint.
        point = latest_complete_checkpoint(job_id, database_url=options["database_url"])
        attempt = next_run_attempt(job_id, database_url=options["database_url"])
        found = [None if point is None else (point.path, point.step), attempt]
    dist.broadcast_object_list(found, src=0)
    resume_from, run_attempt = found

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    if resume_from is not None:
        path, start = resume_from
        model_state, optim_state = get_state_dict(model, optimizer)
        load({"model": model_state, "optim": optim_state}, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)

    # async_save runs its collectives in a thread: on a group of their own, never the training's.
    save_group = dist.new_group(backend="gloo") if options.get("async_save") else None
    progress_path = Path(options["progress_dir"], f"progress-{rank}.json")
    progress: dict[str, Any] = {"pid": os.getpid(), "start_step": start, "losses": {}}
    reporter = CheckpointReporter(
        rank=rank,
        world_size=WORLD_SIZE,
        run_attempt=run_attempt,
        install_signal_handler=False,
        spot_poll=False,
        connect_timeout_s=0.5,
        backoff_cap_s=0.5,
    )
    if options.get("kill_rank") == rank:
        die_inside_the_save(options["kill_at_step"], reporter)
    pending: Any = None
    try:
        for step in range(start + 1, options["max_steps"] + 1):
            x, y = batch(step, rank)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
            progress["losses"][str(step)] = loss.item()
            tmp = progress_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(progress))
            tmp.replace(progress_path)  # the test reads whole files only
            if step % options["every_n_steps"]:
                continue
            model_state, optim_state = get_state_dict(model, optimizer)
            directory = Path(options["ckpt_dir"], f"step-{step}")
            state = {"model": model_state, "optim": optim_state}
            fields: dict[str, Any] = {"step": step, "epoch": 0, "loss": loss.item()}
            if save_group is None:
                save(state, checkpoint_id=directory)
                report_dcp_saved(reporter, directory, **fields)
            else:
                if pending is not None:
                    pending.result()  # one save in flight at a time, and reported
                saving = async_save(state, checkpoint_id=directory, process_group=save_group)
                pending = report_dcp_when_saved(reporter, saving, directory, **fields)
        if pending is not None:
            pending.result()
    finally:
        reporter.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    job_options = json.loads(sys.argv[1])
    sys.exit(fork_ranks(WORLD_SIZE, lambda rank: run_rank(rank, job_options)))
