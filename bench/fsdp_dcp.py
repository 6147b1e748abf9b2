"""FSDP2 + DCP on one machine: what a sharded save and its report cost the training step.

``world_size`` ranks (forked, one process each) train a stack of ``Linear`` layers under
``fully_shard`` (backend ``cpu:gloo,cuda:nccl`` on CUDA, gloo on CPU); every few steps each rank
saves with ``dcp.async_save`` and reports its part with ``report_dcp_when_saved`` through its own
reporter and moto's SQS. Printed and written to ``DIR/fsdp_dcp.json``: per rank the median step,
the save call's time on the training thread, and the reports drained back (each step once per
rank). Two ranks on one GPU: NCCL refuses two ranks on one device; the refusal is recorded as
the result (``refused``), not hidden.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import cli, drain_bodies, fresh_queue, moto_sqs, parse
from ckpt_pipeline.local.ports import free_loopback_port


def _rank(rank: int, opts: dict[str, Any], results: Any) -> None:
    """One rank: train, save every ``every`` steps, report, put its figures on ``results``."""
    try:
        results.put(_train(rank, opts))
    except Exception as exc:
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:500],
                     "trace": traceback.format_exc()[-1500:]})  # fmt: skip


def _train(rank: int, opts: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import async_save
    from torch.distributed.fsdp import fully_shard

    from trainer_client import CheckpointReporter
    from trainer_client.integrations.dcp import report_dcp_when_saved

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(opts["world_size"]))
    cuda = opts["device"] == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{opts['port']}",
        rank=rank, world_size=opts["world_size"],
    )  # fmt: skip
    width = opts["width"]
    layers = max(1, round(opts["size"] / (12 * width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # async_save runs its collectives in a thread: on a group of their own, never the training's.
    save_group = dist.new_group(backend="gloo")
    reporter = CheckpointReporter(
        opts["queue_url"], job_id=opts["job_id"], spool_dir=opts["spool"], rank=rank,
        world_size=opts["world_size"], spot_poll=False, install_signal_handler=False,
        close_timeout_s=600.0,
    )  # fmt: skip
    steps: list[tuple[float, bool]] = []
    save_calls: list[float] = []
    pending: Any = None
    for step in range(1, opts["every"] * opts["saves"] + 1):
        start = time.perf_counter()
        x = torch.randn(opts["batch"], width, device=device)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        steps.append((time.perf_counter() - start, reporter.stats.finishing > 0))
        if step % opts["every"]:
            continue
        if pending is not None:
            pending.result()  # one async save at a time, as DCP advises
        directory = Path(opts["out"]) / f"step-{step}"
        start = time.perf_counter()
        model_state, optim_state = get_state_dict(model, optimizer)
        saving = async_save({"model": model_state, "optim": optim_state},
                            checkpoint_id=str(directory), process_group=save_group)  # fmt: skip
        pending = report_dcp_when_saved(reporter, saving, directory, step=step, epoch=0)
        save_calls.append(time.perf_counter() - start)
    if pending is not None:
        pending.result()
    flushed = reporter.close(timeout=600)
    dist.destroy_process_group()
    warm = steps[2:] or steps  # the first two steps warm up
    busy = [s for s, b in warm if b]
    idle = [s for s, b in warm if not b]
    ratio = statistics.median(busy) / statistics.median(idle) if busy and idle else None
    step_ms = 1000 * statistics.median(s for s, _ in warm)
    return {
        "rank": rank, "layers": layers, "step_ms_median": step_ms, "step_busy_over_idle": ratio,
        "save_call_ms": [round(1000 * s, 1) for s in save_calls], "flushed": flushed,
    }  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = cli(__doc__)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--world-size", type=int, choices=[1, 2], default=1)
    p.add_argument("--size-gb", type=float, default=1.0, help="checkpoint size, all ranks")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--every", type=int, default=10, help="steps between saves")
    p.add_argument("--out", type=Path, default=None, help="results (and checkpoints) here")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for all ranks")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ranks; print and write their figures; 1 when a rank failed or a report is off."""
    args = parse(parser(), argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="fsdp-dcp-"))
    out.mkdir(parents=True, exist_ok=True)
    work = out / "ckpt"
    result: dict[str, Any] = {"device": args.device, "world_size": args.world_size,
                              "size_gb": args.size_gb}  # fmt: skip
    with moto_sqs() as (_, sqs):
        queue = fresh_queue(sqs, "fd")
        opts = {
            "device": args.device, "world_size": args.world_size, "port": free_loopback_port(),
            "size": int(args.size_gb * 1e9), "width": args.width, "batch": args.batch,
            "saves": args.saves, "every": args.every, "queue_url": queue,
            "job_id": f"fsdp-dcp-{uuid.uuid4().hex[:8]}", "spool": str(out / "spool"),
            "out": str(work),
        }  # fmt: skip
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        procs = [
            context.Process(target=_rank, args=(r, opts, results)) for r in range(args.world_size)
        ]
        for p in procs:
            p.start()
        ranks = []
        deadline = time.monotonic() + args.timeout
        for _ in procs:
            try:
                ranks.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
            except Exception:  # queue.Empty: a rank hung (NCCL on a shared device may)
                ranks.append({"error": f"no result within {args.timeout} s"})
                break
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        bodies = drain_bodies(sqs, queue)
    result["ranks"] = sorted(ranks, key=lambda r: r.get("rank", 99))
    errors = [r["error"] for r in ranks if "error" in r]
    if errors and args.device == "cuda" and args.world_size == 2:
        result["refused"] = errors[0]
    expected = sorted(
        s * args.every for s in range(1, args.saves + 1) for _ in range(args.world_size)
    )
    result["reports"] = "ok" if sorted(b["step"] for b in bodies) == expected else (
        f"steps {sorted(b['step'] for b in bodies)} != {expected}"
    )  # fmt: skip
    result["ckpt_bytes"] = sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) // max(
        1, args.saves
    )
    (out / "fsdp_dcp.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    if "refused" in result:
        return 0  # the answer to "two ranks on one GPU" is the refusal itself
    return 1 if errors or result["reports"] != "ok" else 0
