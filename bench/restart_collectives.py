"""The restart's collective bytes per rank and its time to decision, at several world sizes.

Per ``--ranks`` N: a checkpoint of one object per rank, named by its rank (as DCP, ZeRO and the
HF ``Trainer``'s RNG files are: the whole object table grows with the ranks) is uploaded to
moto's S3, its reports written by the real writer into a migrated database, and a node copy
restored; then N gloo processes on this machine, as nodes of :data:`PER_NODE` ranks (torchrun's
``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), each
call ``trainer_client.restart.resume.resume`` with a ``CheckpointReporter`` on an empty
spool. Each counts what it puts into and takes out of every ``torch.distributed`` collective it
calls (the payload at the call: a tensor's bytes; an object collective's pickles, padded to the
largest as torch pads them, and its int64 size header), and ``decided_s``.

The table: bytes each rank sends and receives (rank 0 and the most of any other rank), split into
the fixed-size collectives, the decision's header (every rank) and its table (point-to-point, a
node's first rank only), and the slowest rank's time to decision. Below it, the model at
``--model-ranks``: the fixed part and the header as measured, a node's table at its bytes per row.

Run: ``python -m bench restart_collectives [--ranks 8 16 32]``.
To measure another tree's restart (``before``): put its ``trainer_client`` first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import helpers_s3, load
from bench.restore import _s3_server, _seed_database, upload
from trainer_client.storage.restore import restore

# The counted calls whose payload is the decision (the rest are fixed-size, or were the gathers).
_DECISION = ("broadcast_object_list", "broadcast[uint8]", "table")
PER_NODE = 4


def count_collectives(dist: Any, tally: dict[str, list[int]]) -> None:
    """Wrap ``dist``'s collectives so that each adds [sent, received] bytes to ``tally[name]``."""
    rank = dist.get_rank()

    def add(name: str, sent: int, received: int) -> None:
        entry = tally.setdefault(name, [0, 0])
        entry[0] += sent
        entry[1] += received

    def nbytes(tensor: Any) -> int:
        return int(tensor.numel() * tensor.element_size())

    all_reduce, broadcast = dist.all_reduce, dist.broadcast
    all_gather_object, broadcast_object_list = dist.all_gather_object, dist.broadcast_object_list

    def counted_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        add("all_reduce", nbytes(tensor), nbytes(tensor))
        return all_reduce(tensor, *args, **kwargs)

    def counted_broadcast(tensor: Any, src: int, *args: Any, **kwargs: Any) -> Any:
        name = "broadcast[uint8]" if str(tensor.dtype) == "torch.uint8" else "broadcast"
        add(name, *((nbytes(tensor), 0) if rank == src else (0, nbytes(tensor))))
        return broadcast(tensor, src, *args, **kwargs)

    def counted_all_gather_object(out: list[Any], obj: Any, *args: Any, **kwargs: Any) -> Any:
        result = all_gather_object(out, obj, *args, **kwargs)
        largest = max(len(pickle.dumps(o)) for o in out)
        add("all_gather_object", 8 + largest, 8 * len(out) + largest * len(out))
        return result

    def counted_broadcast_object_list(objs: list[Any], src: int = 0, *a: Any, **k: Any) -> Any:
        result = broadcast_object_list(objs, src, *a, **k)
        size = 8 * len(objs) + sum(len(pickle.dumps(o)) for o in objs)
        add("broadcast_object_list", *((size, 0) if rank == src else (0, size)))
        return result

    def counted_batch(ops: list[Any]) -> Any:
        # The tables rank 0 sends each node's first rank, then the relay down the leaders' tree
        # (wire_table.py): a leader sends too.
        for op in ops:
            sent = getattr(op.op, "__name__", "") == "isend"
            add("table", *((nbytes(op.tensor), 0) if sent else (0, nbytes(op.tensor))))
        return batch(ops)

    batch, dist.batch_isend_irecv = dist.batch_isend_irecv, counted_batch
    dist.all_reduce, dist.broadcast = counted_all_reduce, counted_broadcast
    dist.all_gather_object = counted_all_gather_object
    dist.broadcast_object_list = counted_broadcast_object_list


def _rank(
    rank: int, ranks: int, port: int, job: str, url: str, dirs: tuple[str, str], out: Any
) -> None:
    import torch.distributed as dist

    from trainer_client import CheckpointReporter

    # The ranks' own lines (the decision, the unsent restart record: there is no queue) would
    # bury the table.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    os.environ.update(LOCAL_RANK=str(rank % PER_NODE), LOCAL_WORLD_SIZE=str(PER_NODE))
    from trainer_client.restart.resume import resume

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    reporter = CheckpointReporter(
        "https://sqs.us-east-1.amazonaws.com/000000000000/bench.fifo",
        job_id=job,
        spool_dir=dirs[0],
        rank=rank,
        world_size=ranks,
        spot_poll=False,
        install_signal_handler=False,
    )
    dist.barrier()
    tally: dict[str, list[int]] = {}
    count_collectives(dist, tally)
    try:
        resumed = resume(reporter, database_url=url, restore_to=dirs[1])
        assert resumed is not None and resumed.step == 100, resumed
        out.put((rank, resumed.decided_s, tally))
    except Exception as exc:  # the parent says it, instead of waiting for a rank that is gone
        out.put((rank, -1.0, {"error": [0, 0]}))
        out.put(f"rank {rank}: {type(exc).__name__}: {exc}")
    reporter.close(timeout=1)
    dist.destroy_process_group()


def measure(
    url: str, job: str, ranks: int, node: Path, spool: Path
) -> list[tuple[int, float, dict[str, list[int]]]]:
    """Every rank's (rank, decided_s, bytes per collective) of one restart."""
    from ckpt_pipeline.local.ports import free_loopback_port

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    port = free_loopback_port()
    dirs = (str(spool), str(node))
    procs = [
        ctx.Process(target=_rank, args=(r, ranks, port, job, url, dirs, out)) for r in range(ranks)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
    failed = [r for r in results if r[1] < 0]
    if failed:
        raise RuntimeError(out.get(timeout=10))
    return sorted(results)


def split(tally: dict[str, list[int]]) -> tuple[int, int, int, int, int]:
    """(fixed sent, fixed received, decision sent, header received, table received) of one
    rank's tally."""
    fixed = [v for k, v in tally.items() if k not in _DECISION]
    decision = [v for k, v in tally.items() if k in _DECISION]
    return (
        sum(v[0] for v in fixed),
        sum(v[1] for v in fixed),
        sum(v[0] for v in decision),
        sum(v[1] for k, v in tally.items() if k in _DECISION[:2]),
        tally.get("table", [0, 0])[1],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench restart_collectives", description=__doc__
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--model-ranks", type=int, default=100_000)
    args = parser.parse_args(argv)
    import trainer_client

    print(f"# restart collectives: trainer_client from {Path(trainer_client.__file__).parent}")
    print(f"# load {load()}; bytes per rank at the call (payload, not the algorithm's wire)")
    print(
        "| ranks | objects | rank 0 fixed sent/recv B | others fixed sent/recv B (max) "
        "| rank 0 decision sent B | others header recv B | node first ranks table recv B "
        "| other ranks table recv B | gathered B | decided_s max | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    from ckpt_pipeline.local.embedded_pg import database_url_or_embedded
    from lambda_writer import apply_migrations, connect_url

    measured: list[tuple[int, int]] = []
    fixed_most = 0
    with (
        _s3_server("moto") as endpoint,
        tempfile.TemporaryDirectory(dir="/tmp") as scratch,
        database_url_or_embedded(dbname_prefix="bench_collectives_") as database,
    ):
        with connect_url(database.url) as conn:
            apply_migrations(conn)
        client = helpers_s3(endpoint, 8)
        bucket = f"collectives-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        for ranks in args.ranks:
            files = ranks
            job = f"coll-{uuid.uuid4().hex[:6]}"
            prefix = f"{job}/step-100"
            objects = upload(client, bucket, prefix, files * 1024, files, "shard_rank{:02d}.bin")
            root = f"s3://{bucket}/{prefix}"
            _seed_database(database.url, job, ranks, objects, root, client)
            node = Path(scratch, job)
            restore(objects, node / "step-100", client=client, max_workers=8)
            results = measure(database.url, job, ranks, node, Path(scratch, f"{job}-spool"))
            zero = split(results[0][2])
            others = [split(t) for _, _, t in results[1:]]
            gathered = max(t.get("all_gather_object", [0, 0])[1] for _, _, t in results)
            fixed_most = max(fixed_most, zero[0], zero[1], *(max(o[0], o[1]) for o in others))
            first = [o[4] for r, o in enumerate(others, 1) if r % PER_NODE == 0] or [0]
            rest = [o[4] for r, o in enumerate(others, 1) if r % PER_NODE]
            measured.append((max(o[3] for o in others), max(first)))
            print(
                f"| {ranks} | {files} | {zero[0]}/{zero[1]} | "
                f"{max(o[0] for o in others)}/{max(o[1] for o in others)} | {zero[2]} | "
                f"{max(o[3] for o in others)} | {max(first)} | {max(rest)} | {gathered} | "
                f"{max(d for _, d, _ in results):.2f} | {load()} |",
                flush=True,
            )
    if measured:
        header, table = max(measured)
        n = args.model_ranks
        print(
            f"\nmodel at {n:,} ranks: fixed collectives {fixed_most} B per rank and the header "
            f"{header} B (as measured: neither grows); a node's first rank also receives its "
            f"table, {table} B here for {PER_NODE} ranks' rows ({table / PER_NODE:.0f} B a row): "
            f"8 ranks a node, {8 * table / PER_NODE / 1e3:.1f} kB; rank 0 sends {n // 8:,} "
            f"tables, {n * table / PER_NODE / 1e6:.1f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
