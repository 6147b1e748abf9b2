"""A plain-torch job of two ranks: FSDP2 (``fully_shard``) over gloo on CPU, a DCP checkpoint every
few steps (``dcp.save`` or ``dcp.async_save``), each rank's part reported through
``trainer_client.integrations.dcp``; resumes from the database when told to (``resume``: rank 0
asks the database; ``restart``: the restart's call).

Usage: ``python -m tests.integrations.dcp_job '<json options>'`` (reporter settings from the
environment: CKPT_QUEUE_URL, CKPT_JOB_ID, CKPT_SPOOL_DIR). Each rank writes ``progress-<rank>.json``
(pid, the step it started from, the loss of every step it trained) after every step.

``kill_rank``/``kill_at_step``: that rank SIGKILLs itself inside DCP's save of that step, right
after its own shard file is written and before the coordinator gathers the ranks' results: the
shards are on disk, ``.metadata`` never is, and no rank's save returns.

``upload_to`` (``s3://bucket/prefix``): the checkpoints go straight to S3 through
``s3torchconnector``'s DCP writer (at AWS_ENDPOINT_URL), each rank reporting the objects it wrote,
pinned with the SHA-256 of what DCP wrote (``hash_uploads``, ``report_when_saved`` with an S3
client). ``restart``: every rank makes the restart's one
collective call (``trainer_client.restart.resume.resume``: rank 0 decides, the checkpoint
is restored to ``restore_to`` on this node, verified) and ``dcp.load``s the local copy;
``restart_count`` is torchrun's TORCHELASTIC_RESTART_COUNT (the reports' ``run_attempt``).
``freeze_sqs_kill_rank``/``freeze_sqs_kill_at_step``: that rank's SQS requests go through a relay
(tests/integrations/sqs_gate.py) that it freezes before the save of that step (earlier reports
delivered first); once the save returned, its report is spooled and rank 0's report of the step
is in the database, it SIGKILLs itself: its report is durable in its spool and never sent.
``freeze_sqs_rank``: that rank's SQS requests never leave, so every report it made is in its
spool when the job dies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import async_save, save
from torch.distributed.fsdp import fully_shard

from tests.integrations.ranks import fork_ranks
from tests.integrations.sqs_gate import SqsGate, die_when_spooled
from trainer_client import CheckpointReporter
from trainer_client.integrations.dcp import report_dcp_saved, report_dcp_when_saved
from trainer_client.restart.lookup import latest_complete_checkpoint, next_run_attempt
from trainer_client.restart.resume import resume
from trainer_client.storage.dcp_s3 import hash_uploads
from trainer_client.storage.verify import s3_client_for
from trainer_client.torch_integration import report_when_saved

WORLD_SIZE = 2


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one step on one rank: a function of both, so a resumed run sees the same."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def die_inside_the_save(kill_at_step: int) -> None:
    """Make this rank SIGKILL itself in DCP's write of ``kill_at_step``, after its shard.

    Nothing is flushed first: the earlier checkpoints' reports of this rank (and of the rank the
    launcher then kills) may still be in their spools. The restart's call sends them before it
    decides."""
    original = FileSystemWriter.write_data

    def write_data(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        future = original(self, plan, planner)
        # Known by the directory: an async save writes while the loop has moved on.
        if Path(self.path).name == f"step-{kill_at_step}":
            future.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_data  # type: ignore[method-assign,assignment]


def s3_writer(uri: str) -> Any:
    """``s3torchconnector``'s DCP writer at AWS_ENDPOINT_URL: it takes no endpoint, so its file
    system is swapped for one whose client has it (path-style, as the emulators serve)."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    config = S3ClientConfig(force_path_style=True)
    writer: Any = S3StorageWriter(region, uri, s3client_config=config)
    client = S3Client(region, endpoint=os.environ["AWS_ENDPOINT_URL"], s3client_config=config)
    writer.fs = S3FileSystem(region, s3_client=client)
    return writer


def full_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the whole model and optimizer state, gathered from the shards (a collective):
    equal at any world size for equal state."""
    model_state, optim_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True)
    )
    digest = hashlib.sha256()

    def walk(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(name.encode() + value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(f"{name}/{key}", value[key])
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(f"{name}/{i}", item)
        else:
            digest.update(f"{name}={value!r}".encode())

    walk("model", model_state)
    walk("optim", optim_state)
    return digest.hexdigest()


def run_rank(rank: int, options: dict[str, Any]) -> int:
    torch.set_num_threads(1)
    if "restart_count" in options:
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(options["restart_count"])
    gate: SqsGate | None = None
    if options.get("freeze_sqs_kill_rank") == rank:
        gate = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        gate.route_sqs_here()  # before the reporter builds its SQS client
    if options.get("freeze_sqs_rank") == rank:
        # Every report of this rank stays in its spool until the job dies (the restart sends it).
        frozen = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        frozen.route_sqs_here()
        frozen.frozen.set()
    upload_to = options.get("upload_to")
    s3 = s3_client_for(4) if upload_to or options.get("restart") else None
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

    reporter = CheckpointReporter(
        rank=rank,
        world_size=int(options.get("world", WORLD_SIZE)),
        run_attempt=None if options.get("restart") else run_attempt,
        install_signal_handler=False,
        spot_poll=False,
        connect_timeout_s=0.5,
        backoff_cap_s=0.5,
    )
    if options.get("restart"):
        # The restart's one call: every rank, one decision (rank 0's), the files on this node.
        resumed = resume(
            reporter,
            database_url=options["database_url"],
            restore_to=options.get("restore_to"),
            s3_client=s3,
        )
        if resumed is not None:
            Path(options["progress_dir"], f"restart-{rank}.json").write_text(
                json.dumps({"step": resumed.step, "source": resumed.source, "path": resumed.path})
            )
            resume_from = (resumed.path, resumed.step)

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
        if options.get("digests"):
            loaded = full_digest(model, optimizer)
            Path(options["progress_dir"], f"loaded-{rank}.txt").write_text(loaded)

    # async_save runs its collectives in a thread: on a group of their own, never the training's.
    save_group = dist.new_group(backend="gloo") if options.get("async_save") else None
    progress_path = Path(options["progress_dir"], f"progress-{rank}.json")
    progress: dict[str, Any] = {"pid": os.getpid(), "start_step": start, "losses": {}}
    if options.get("kill_rank") == rank:
        die_inside_the_save(options["kill_at_step"])
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
            if upload_to:
                uri = f"{upload_to}/step-{step}"
                freeze = gate is not None and step == options["freeze_sqs_kill_at_step"]
                if freeze:
                    assert gate is not None
                    if not reporter.flush(60):
                        raise RuntimeError("earlier reports not delivered within 60 s")
                    gate.frozen.set()
                writer = s3_writer(uri)
                hashed = hash_uploads(writer)  # pins with what DCP wrote: the restore checks it
                save(state, storage_writer=writer)
                saved: Future[None] = Future()
                saved.set_result(None)
                report_when_saved(
                    reporter, saved, s3_client=s3, sha256_of=hashed, uri=uri, **fields
                )
                if freeze:
                    die_when_spooled(reporter, step, options["database_url"])
            elif save_group is None:
                save(state, checkpoint_id=directory)
                report_dcp_saved(reporter, directory, **fields)
                if options.get("digests"):
                    saved_state = full_digest(model, optimizer)
                    Path(options["progress_dir"], f"saved-{step}.txt").write_text(saved_state)
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
    # The client's own lines (the restart's flush, wait and decision) in job.log, which the
    # tests quote when a rank resumed from an unexpected step.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s rank%(process)d %(name)s: %(message)s"
    )
    job_options = json.loads(sys.argv[1])
    world = int(job_options.get("world", WORLD_SIZE))
    sys.exit(fork_ranks(world, lambda rank: run_rank(rank, job_options)))
