"""Restoring a checkpoint from S3: the restart's restore against boto3's download; the decision.

Method and figures: BENCHMARKS.md §9. Per size, ``--rounds`` rounds alternating the methods
(``METHODS``) on the same pinned objects, each into a fresh directory; the best and median
round's GB/s, the best restore round's ``FetchTrace``; then ``--ranks`` gloo ranks call
``resume`` against the writer's rows with a node copy in place (``decided_s``). ``--plot DIR``
draws ``restore.png``.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import _plot
from bench._harness import cli, helpers_s3, load, moto_sqs, parse, plotted, table
from bench._reports import invoke, lambda_event, report, writer_environment
from ckpt_pipeline.ops.sqs import LOCAL_REGION
from trainer_client.storage.durable import fsync_dir, fsync_path
from trainer_client.storage.restore import DEFAULT_PART_BYTES, RemoteObject, restore
from trainer_client.storage.restore_fetch import FetchTrace
from trainer_client.storage.s3_pins import head_pin

_CHUNK = 8 * 1024 * 1024


@contextlib.contextmanager
def _s3_server(kind: str) -> Iterator[str]:
    if kind == "localstack":
        from ckpt_pipeline.local.localstack import localstack_sqs

        with localstack_sqs(service="s3") as endpoint:
            yield endpoint
    else:
        with moto_sqs() as (endpoint, _):
            yield endpoint


def upload(
    client: Any, bucket: str, prefix: str, total: int, files: int, name: str = "shard-{:02d}.bin"
) -> list[RemoteObject]:
    """``files`` objects of random bytes (``name`` of their index), ``total`` bytes in all,
    pinned from their HEAD."""
    from boto3.s3.transfer import TransferConfig

    objects = []
    config = TransferConfig(multipart_chunksize=_CHUNK, max_concurrency=8)
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(files):
            size = total // files + (1 if index < total % files else 0)
            path, digest = Path(tmp, "f"), hashlib.sha256()
            with path.open("wb") as out:
                left = size
                while left:
                    block = os.urandom(min(_CHUNK, left))
                    digest.update(block)
                    out.write(block)
                    left -= len(block)
            key = f"{prefix}/{name.format(index)}"
            client.upload_file(str(path), bucket, key, Config=config)
            pin = head_pin(client, f"s3://{bucket}/{key}", sha256=digest.hexdigest())
            objects.append(
                RemoteObject(pin.uri, key.rsplit("/", 1)[1], size, pin.sha256, etag=pin.etag)
            )
    return objects


def _boto3_download(
    client: Any, bucket: str, objects: Sequence[RemoteObject], dest: Path, workers: int
) -> None:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    config = TransferConfig(
        multipart_threshold=_CHUNK, multipart_chunksize=_CHUNK, max_concurrency=workers
    )
    dest.mkdir(parents=True)
    with create_transfer_manager(client, config) as manager:
        futures = [
            manager.download(bucket, o.uri.split("/", 3)[3], str(dest / o.relative))
            for o in objects
        ]
        for future in futures:
            future.result()


# boto3+fsync: the same download, then each file and the directory fsynced (what a durable copy
# by hand costs: the restore fsyncs before its rename, a plain download_file never does).
METHODS = ["restore", "boto3", "boto3+fsync"]


def measure(
    client: Any, bucket: str, objects: list[RemoteObject], workers: int, rounds: int, scratch: Path
) -> tuple[dict[str, list[float]], list[FetchTrace]]:
    """Seconds per round of each method, alternating which goes first, and each restore round's
    trace."""
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    traces: list[FetchTrace] = []
    for n in range(rounds):
        order = METHODS[n % len(METHODS) :] + METHODS[: n % len(METHODS)]
        for method in order:
            dest = scratch / f"{method}-{n}"
            start = time.perf_counter()
            if method == "restore":
                traces.append(FetchTrace())
                restore(objects, dest / "checkpoint-1", client=client, max_workers=workers,
                        part_bytes=DEFAULT_PART_BYTES, trace=traces[-1])  # fmt: skip
            else:
                _boto3_download(client, bucket, objects, dest / "checkpoint-1", workers)
                if method == "boto3+fsync":
                    for obj in objects:
                        fsync_path(dest / "checkpoint-1" / obj.relative)
                    fsync_dir(dest / "checkpoint-1")
            times[method].append(time.perf_counter() - start)
            shutil.rmtree(dest)
    return times, traces


def breakdown(trace: FetchTrace, workers: int) -> str:
    """One line: where a restore's time went."""
    seconds = trace.seconds
    return (
        f"{trace.requests} GETs, {trace.mean_in_flight():.1f} of {workers} in flight on average; "
        f"thread-seconds: GET {seconds['get']:.2f}, write {seconds['write']:.2f}, "
        f"hash {seconds['hash']:.2f}, write-back {seconds['writeback']:.2f}; "
        f"submitter waiting for a slot {seconds['wait']:.2f} s; "
        f"fsyncs after the last part {seconds['fsync']:.2f} s"
    )


def plot_restore(rows: Sequence[tuple[float, float, float, float]], path: Path) -> Path:
    """Throughput (GB/s, best round) of the restore, boto3, and boto3 + fsync per size."""
    fig, (ax,) = _plot.figure("Restore from S3 (LocalStack): verified restore vs boto3")
    width = 0.27
    xs = list(range(len(rows)))
    series = [
        (1, _plot.PIPELINE, "restore (SHA-256 while streaming, fsync, rename)"),
        (2, _plot.DIRECT, "boto3 download (no verification, no fsync)"),
        (3, _plot.FLOOR, "boto3 download, then fsync"),
    ]
    for offset, (column, colour, label) in zip((-width, 0.0, width), series, strict=True):
        bars = ax.bar([x + offset for x in xs], [r[column] for r in rows], width, color=colour,
                      label=label)  # fmt: skip
        for bar, row in zip(bars, rows, strict=True):
            ax.annotate(f"{row[column] / row[2]:.0%}", (bar.get_x() + width / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(xs, [f"{r[0]:g} GB" for r in rows])
    ax.set_xlabel("checkpoint (8 objects); labels: share of boto3's throughput")
    ax.set_ylabel("GB/s, best round")
    ax.set_ylim(0, 1.5 * max(max(r[1:]) for r in rows))  # room for the legend above the bars
    ax.legend(loc="upper left", fontsize=8)
    return _plot.save(fig, path)


# -- the decision with N ranks -----------------------------------------------------------------


def _seed_database(
    url: str, job: str, ranks: int, objects: list[RemoteObject], root: str, client: Any
) -> None:
    """One complete checkpoint (step 100), each rank reporting its share of the objects."""
    handler = writer_environment(url)
    reports = []
    for rank in range(ranks):
        mine = objects[rank::ranks]
        pins = [head_pin(client, o.uri, sha256=o.sha256) for o in mine]
        reports.append(report(job, 100, rank, ranks, uri=root, bytes=sum(o.bytes for o in mine),
                              objects=pins or None))  # fmt: skip
    invoke(handler, lambda_event(reports))


def _rank(
    rank: int, ranks: int, port: int, job: str, url: str, spool: str, restore_to: str, out: Any
) -> None:
    import torch.distributed as dist

    from trainer_client import CheckpointReporter
    from trainer_client.restart.resume import resume

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    reporter = CheckpointReporter(
        f"https://sqs.{LOCAL_REGION}.amazonaws.com/000000000000/bench.fifo", job_id=job,
        spool_dir=spool, rank=rank, world_size=ranks, spot_poll=False,
        install_signal_handler=False,
    )  # fmt: skip
    dist.barrier()
    resumed = resume(reporter, database_url=url, restore_to=restore_to)
    assert resumed is not None
    out.put((rank, resumed.decided_s, resumed.source, resumed.step))
    reporter.close(timeout=1)
    dist.destroy_process_group()


def decision_times(url: str, job: str, ranks: int, restore_to: Path, spool: Path) -> list[float]:
    """Every rank's ``decided_s`` of one restart."""
    from ckpt_pipeline.local.ports import free_loopback_port

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    port = free_loopback_port()
    procs = [
        ctx.Process(target=_rank, args=(r, ranks, port, job, url, str(spool), str(restore_to), out))
        for r in range(ranks)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(60)
    assert {r[3] for r in results} == {100}, results
    return [r[1] for r in sorted(results)]


def main(argv: Sequence[str] | None = None) -> int:
    p = cli(__doc__, plot="restore.png")
    p.add_argument("--sizes-gb", type=float, nargs="+", default=[1.0])
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--s3", choices=["localstack", "moto"], default=None)
    args = parse(p, argv)
    from ckpt_pipeline.local.localstack import installed_python

    kind = args.s3 or ("localstack" if installed_python() is not None else "moto")
    print(
        f"# restore bench: S3 on {kind}, {args.files} files, {args.workers} workers, load {load()}"
    )
    with _s3_server(kind) as endpoint, tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        client = helpers_s3(endpoint, args.workers)
        bucket = f"restore-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        print("# GB/s and ratios: best round / median round")
        table(
            "| checkpoint | restore, verified (GB/s) | boto3 TransferManager (GB/s) | ratio "
            "| boto3 + fsync (GB/s) | ratio | rounds (s), restore / boto3 / boto3 + fsync | load |"
        )
        notes: list[str] = []
        objects: list[RemoteObject] = []
        root = ""
        rows: list[tuple[float, float, float, float]] = []
        for size_gb in args.sizes_gb:
            total = int(size_gb * 1e9)
            root = f"s3://{bucket}/job/{size_gb:g}gb/checkpoint-1"
            objects = upload(client, bucket, f"job/{size_gb:g}gb/checkpoint-1", total, args.files)
            times, traces = measure(
                client, bucket, objects, args.workers, args.rounds, Path(scratch)
            )
            best = [total / min(times[m]) / 1e9 for m in METHODS]
            median = [total / statistics.median(times[m]) / 1e9 for m in METHODS]
            cells = [f"{b:.3f} / {m:.3f}" for b, m in zip(best, median, strict=True)]
            ratios = [f"{best[0] / best[i]:.0%} / {median[0] / median[i]:.0%}" for i in (1, 2)]
            rounds = " / ".join(" ".join(f"{t:.2f}" for t in times[m]) for m in METHODS)
            print(
                f"| {size_gb:g} GB | {cells[0]} | {cells[1]} | {ratios[0]} | {cells[2]} | "
                f"{ratios[1]} | {rounds} | {load()} |",
                flush=True,
            )
            fastest = traces[times["restore"].index(min(times["restore"]))]
            notes.append(f"{size_gb:g} GB, best restore round: {breakdown(fastest, args.workers)}")
            rows.append((size_gb, best[0], best[1], best[2]))
            if size_gb != args.sizes_gb[-1]:
                for obj in objects:
                    client.delete_object(Bucket=bucket, Key=obj.uri.split("/", 3)[3])
        print("\n" + "\n".join(notes), flush=True)
        # The decision, on the last size's checkpoint, a node copy already in place.
        from ckpt_pipeline.local.embedded_pg import database_url_or_embedded
        from lambda_writer import apply_migrations, connect_url

        with database_url_or_embedded(dbname_prefix="bench_restore_") as database:
            with connect_url(database.url) as conn:
                apply_migrations(conn)
            job = f"restore-{uuid.uuid4().hex[:6]}"
            _seed_database(database.url, job, args.ranks, objects, root, client)
            node = Path(scratch, "node")
            restore(objects, node / "checkpoint-1", client=client, max_workers=args.workers)
            spool = Path(scratch, "spool")
            decided = decision_times(database.url, job, args.ranks, node, spool)
        print(
            f"\ncall to decision, {args.ranks} ranks (gloo, this machine): max "
            f"{max(decided):.2f} s, median {statistics.median(decided):.2f} s "
            f"(per rank: {' '.join(f'{d:.2f}' for d in decided)}); load {load()}",
            flush=True,
        )
        if args.plot and rows:
            plotted(plot_restore(rows, args.plot / "restore.png"))
    return 0
