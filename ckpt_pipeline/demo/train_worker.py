"""One rank of the demo's training job, run by ``torchrun -m ckpt_pipeline.demo.train_worker``.

A tiny DDP model on synthetic data. Each epoch ends with a checkpoint: every rank saves its shard
atomically (``torch.save`` to a temp file, fsync, rename) and only then reports it. On a restart
(``TORCHELASTIC_RESTART_COUNT`` > 0) rank 0 reads the latest complete checkpoint from the database
once and broadcasts it, so the job resumes from what the pipeline says is complete — not from what
a rank believes it wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer_client import CheckpointReporter
from trainer_client.restart.lookup import latest_complete_checkpoint
from trainer_client.torch_integration import atomic_torch_save


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--epoch-seconds", type=float, default=0.0, help="simulated compute")
    parser.add_argument(
        "--preempt",
        default="",
        help="ATTEMPT:EPOCH:RANK — that rank SIGKILLs itself in that epoch, before its checkpoint",
    )
    return parser.parse_args(argv)


def write_progress(workdir: Path, rank: int, **fields: Any) -> None:
    """Atomically publish this rank's progress for the demo's display."""
    path = workdir / "progress" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "time": time.time(), **fields}))
    tmp.replace(path)


def resume_point(job_id: str, database_url: str | None) -> tuple[int, int, dict[int, str]] | None:
    """(step, epoch, shard URIs by rank) of the job's latest complete checkpoint whose files are
    as reported, if any: the shipped resume helper's answer."""
    if not database_url:
        return None
    point = latest_complete_checkpoint(job_id, database_url=database_url)
    return None if point is None else (point.step, point.epoch, dict(point.uris))


def init_process_group(attempt: int) -> None:
    """Join the gloo group through torchrun's store, under a prefix of this run attempt.

    Seen with torch 2.13 on loopback: after a restart, plain ``init_process_group("gloo")`` read
    the previous attempt's peer addresses from the agent's store and failed to connect
    ("Gloo connectFullMesh failed ... Connection refused"); a per-attempt prefix avoids them.
    """
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"ckpt-attempt-{attempt}", store),  # type: ignore[attr-defined]
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_process_group(attempt)
    rank = dist.get_rank()
    preempt = tuple(int(x) for x in args.preempt.split(":")) if args.preempt else None

    torch.manual_seed(1234)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    start_epoch = 0
    if attempt > 0:
        # One read by rank 0, broadcast: N ranks must not each open a connection to find it.
        found = [
            resume_point(args.job_id, os.environ.get("CKPT_DEMO_DATABASE_URL"))
            if rank == 0
            else None
        ]
        dist.broadcast_object_list(found, src=0)
        if found[0] is not None:
            step, epoch, uris = found[0]
            state = torch.load(uris[rank].removeprefix("file://"), weights_only=True)
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = epoch + 1

    spool_dir = args.workdir / "spool"
    with CheckpointReporter(job_id=args.job_id, spool_dir=spool_dir) as reporter:
        generator = torch.Generator().manual_seed(rank)
        for epoch in range(start_epoch, args.epochs):
            write_progress(args.workdir, rank, attempt=attempt, epoch=epoch, phase="train")
            started = time.monotonic()
            for _ in range(args.steps_per_epoch):
                x = torch.randn(32, 16, generator=generator)
                loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
            time.sleep(max(0.0, args.epoch_seconds - (time.monotonic() - started)))
            if preempt == (attempt, epoch, rank):
                # Preemption without warning: no flush, no atexit, no finally blocks.
                os.kill(os.getpid(), signal.SIGKILL)
            step = (epoch + 1) * args.steps_per_epoch
            path = args.workdir / "ckpt" / args.job_id / f"a{attempt}" / f"s{step}" / f"r{rank}.pt"
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            size, sha256 = atomic_torch_save(state, path)
            reporter.report(
                step=step,
                epoch=epoch,
                uri=path.resolve().as_uri(),
                loss=loss.detach(),
                metrics={"lr": 0.05},
                bytes=size,
                sha256=sha256,
            )
            write_progress(args.workdir, rank, attempt=attempt, epoch=epoch, phase="reported")
            dist.barrier()
        flushed = reporter.flush(timeout=20)
    write_progress(args.workdir, rank, attempt=attempt, epoch=args.epochs, phase="done")
    dist.destroy_process_group()
    return 0 if flushed else 3


if __name__ == "__main__":
    sys.exit(main())
