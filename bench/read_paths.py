"""Read paths at 100,000 shards: verification by listing vs by HEAD, the resume lookup, reconcile.

Method and figures: BENCHMARKS.md §10. S3: one DCP checkpoint per ``--shards`` (moto filled
before it listens, ``bench._s3_filled``, or a running emulator), verified by listing and by HEAD
(sampled above ``--head-max``, then scaled), then ``reconcile``; or, with ``--pages``, where a
listing's time goes, page by page (``bench._pages``). Database: jobs of ``--ranks`` x
``--checkpoints`` filled in SQL (``bench._read_db``), the lookup, best, and the listing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _plot, _read_db
from bench._harness import caller_s3, cli, load, machine, migrated_database, parse, plotted, table
from bench._pages import expected_of, list_pages
from bench._s3_filled import Fill, etag, filled_s3_process, put_over_http
from trainer_client.storage.verify import Expected, VerifyBy, verify_objects


@dataclass
class Pass:
    """One verification pass over one checkpoint."""

    shards: int
    verify_by: VerifyBy
    requests: int
    seconds: float
    cpu_s: float
    sampled: int = 0  # HEADed this many and scaled, or 0: every object

    @property
    def per_object_ms(self) -> float:
        return 1000 * self.cpu_s / (self.shards + 1)  # cpu_s is of the whole checkpoint


def one_pass(
    client: Any, expected: Sequence[Expected], shards: int, by: VerifyBy, *, workers: int,
    sample: int,
) -> Pass:  # fmt: skip
    """Verify (a sample of) ``expected`` once; requests counted at before-send."""
    sent: Counter[str] = Counter()

    def count(event_name: str, **_: Any) -> None:
        sent[event_name] += 1

    client.meta.events.register("before-send.s3", count)
    subset = random.Random(0).sample(list(expected), sample) if sample else expected
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        result = verify_objects(subset, s3_client=client, max_workers=workers, verify_by=by)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        client.meta.events.unregister("before-send.s3", count)
    if not result.intact:
        raise SystemExit(f"{by} {shards}: {result.summary()}")
    scale = len(expected) / sample if sample else 1.0
    requests = sum(sent.values())
    return Pass(shards, by, round(requests * scale), seconds * scale, cpu * scale, sample)


def s3_passes(endpoint: str, fills: Sequence[Fill], args: argparse.Namespace) -> list[Pass]:
    """Listing then HEAD over each checkpoint, printed as they finish."""
    client = caller_s3(endpoint, args.workers, text_timestamps=args.text_timestamps)
    passes = []
    table("| shards | verified by | requests | seconds | client CPU ms/object | load |")
    for fill in fills:
        expected = expected_of(fill)
        sample = args.head_sample if len(expected) > args.head_max else 0
        for by, n in (("listing", 0), ("head", sample)):
            p = one_pass(client, expected, fill.count, by, workers=args.workers, sample=n)  # type: ignore[arg-type]
            passes.append(p)
            how = f"HEAD, {p.sampled:,} sampled, scaled" if p.sampled else by
            print(f"| {fill.count:,} | {how} | {p.requests:,} | {p.seconds:.2f}"
                  f" | {p.per_object_ms:.3f} | {load()} |", flush=True)  # fmt: skip
    return passes


def reconcile_time(endpoint: str, fill: Fill, url: str, workers: int) -> tuple[float, int, str]:
    """``reconcile`` over ``fill``'s store with its rows in the database: seconds, requests."""
    import psycopg

    from ckpt_pipeline.ops.reconcile import Store, reconcile

    job = "rp-reconcile"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        step = fill.count
        conn.execute(
            "INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size,"
            " shards_present, is_complete, first_reported_at) VALUES (%s, %s, 0, 0, %s, %s,"
            " true, now())",
            (job, step, fill.count, fill.count),
        )
        keys = fill.object_keys()
        with conn.cursor().copy(
            "COPY training_checkpoint_shards (job_id, step, rank, run_attempt, epoch,"
            " world_size, uri, size_bytes, objects, reported_at) FROM STDIN"
        ) as copy:
            for rank in range(fill.count):
                # rank 0 also pins the .metadata (DCP's coordinator writes it)
                mine = [keys[rank]] + ([keys[-1]] if rank == 0 else [])
                pins = json.dumps(
                    [{"uri": f"s3://{fill.bucket}/{k}", "bytes": 16, "etag": etag(k)} for k in mine]
                )
                uri = f"s3://{fill.bucket}/{keys[rank]}"
                copy.write_row((job, step, rank, 0, 0, fill.count, uri, 16, pins, "now"))
    client = caller_s3(endpoint, workers)
    sent: Counter[str] = Counter()
    client.meta.events.register("before-send.s3", lambda event_name, **_: sent.update([event_name]))
    t0 = time.perf_counter()
    result, _ = reconcile(
        job_id=job, store=Store.parse(f"s3://{fill.bucket}/job/"), database_url=url, s3=client
    )
    return time.perf_counter() - t0, sum(sent.values()), result.summary()


def plot_read_paths(passes: Sequence[Pass], path: Path, emulator: str) -> Path:
    """Requests (left) and seconds (right) to verify one checkpoint vs its shards, by listing and
    by HEAD per object (log-log; sampled HEAD passes are scaled to the whole checkpoint)."""
    fig, (req_ax, sec_ax) = _plot.figure(
        f"Verifying one checkpoint on S3 ({emulator}): listing vs HEAD", 2
    )
    for how, colour, label in (
        ("listing", _plot.PIPELINE, "by listing"),
        ("head", _plot.DIRECT, "HEAD each"),
    ):
        mine = sorted((p for p in passes if p.verify_by == how), key=lambda p: p.shards)
        xs = [p.shards for p in mine]
        req_ax.plot(xs, [p.requests for p in mine], "o-", color=colour, label=label)
        sec_ax.plot(xs, [p.seconds for p in mine], "o-", color=colour, label=label)
    for ax, name in ((req_ax, "S3 requests"), (sec_ax, "seconds")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shards (objects) in the checkpoint")
        ax.set_ylabel(name)
        ax.legend(fontsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = cli(__doc__, plot="read_paths.png")
    p.add_argument("--shards", type=int, nargs="+", default=[1000, 4096, 16384, 100_000])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--head-max", type=int, default=20_000, help="HEAD all up to this many")
    p.add_argument("--head-sample", type=int, default=10_000)
    p.add_argument("--ranks", type=int, default=100_000, help="ranks of the lookup's job")
    p.add_argument("--checkpoints", type=int, nargs="+", default=[100])
    p.add_argument("--wide-ranks", type=int, default=1000,
                   help="ranks of the jobs that compare 100 with 1,000 checkpoints")  # fmt: skip
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pages", action="store_true",
                   help="S3 only: where each listing's time goes, per page, instead of the"
                   " passes and reconcile")  # fmt: skip
    p.add_argument("--list-workers", type=int, nargs="+", default=[64],
                   help="--pages: listings at once of each concurrent pass")  # fmt: skip
    p.add_argument("--no-serial", action="store_true", help="--pages: the concurrent passes only")
    p.add_argument(
        "--server-pid",
        type=int,
        help="--pages with --s3-endpoint: the emulator's process (its CPU from /proc)",
    )
    p.add_argument("--no-db", action="store_true", help="S3 and reconcile only")
    p.add_argument("--no-s3", action="store_true", help="the database's lookups only")
    p.add_argument("--database-url",
                   help="a database to keep the jobs in (migrated; a job already there is not"
                   " filled again), so that filling runs apart from the measured run; default: a"
                   " throwaway one")  # fmt: skip
    p.add_argument("--fill-only", action="store_true", help="fill the jobs, measure nothing")
    p.add_argument("--s3-endpoint",
                   help="a running S3 emulator (LocalStack's) to PUT the checkpoints into over"
                   " HTTP (once: a bucket already filled is kept) and measure on; default: moto's,"
                   " filled in-process")  # fmt: skip
    p.add_argument("--s3-name", default="moto", help="the emulator's name in the output")
    p.add_argument("--text-timestamps", action="store_true",
                   help="verify with a client that leaves timestamps as text, as the helpers'"
                   " own clients do; default: botocore's default parser, as a client a caller"
                   " passes")  # fmt: skip
    args = parse(p, argv)
    if args.pages and args.s3_endpoint and not args.server_pid:
        p.error("--pages with --s3-endpoint needs --server-pid (the server's process)")
    from lambda_writer import apply_migrations, connect_url

    print(f"read_paths: {machine()}", flush=True)
    fills = [Fill(f"rp-{n}", f"job/step-{n}/", n) for n in sorted(args.shards)]
    if args.pages:  # S3 only: no database
        with _s3_server(args, fills) as (endpoint, pid):
            for fill in fills:
                list_pages(endpoint, pid, fill, args)
        return 0
    status = 0
    database = (
        contextlib.nullcontext(args.database_url)
        if args.database_url
        else migrated_database(prefix="bench_read_paths_")
    )
    with database as url:
        with connect_url(url) as conn:
            apply_migrations(conn)  # a kept --database-url too (idempotent)
        passes: list[Pass] = []
        if not args.no_s3 and args.s3_endpoint and args.fill_only:
            t0 = time.perf_counter()
            put = put_over_http(caller_s3(args.s3_endpoint, 32), fills, workers=32)
            print(f"S3 ({args.s3_name}): PUT {sum(f.count + 1 for f in put):,} objects over HTTP"
                  f" in {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        if not args.no_s3 and not args.fill_only:
            with _s3_server(args, fills) as (endpoint, _):
                passes = s3_passes(endpoint, fills, args)
                took, requests, summary = reconcile_time(endpoint, fills[-1], url, args.workers)
                print(f"reconcile over {fills[-1].count + 1:,} objects: {took:.1f} s,"
                      f" {requests} requests: {summary}", flush=True)  # fmt: skip
            status |= _verdicts(passes)
        if not args.no_db:
            jobs = [_read_db.Job(f"rp-{args.ranks}x{c}", args.ranks, c) for c in args.checkpoints]
            jobs += [_read_db.Job(f"rp-{args.wide_ranks}x{c}", args.wide_ranks, c)
                     for c in (100, 1000)]  # fmt: skip
            for job in jobs:
                if _read_db.filled(url, job):
                    print(f"{job.job_id}: filled before", flush=True)
                    continue
                took = _read_db.fill(url, job)
                print(f"filled {job.job_id}: {job.rows:,} shard rows in {took:.0f} s", flush=True)
            for job in jobs:
                built, took = _read_db.build_manifests(url, job)
                if built:
                    print(f"{job.job_id}: {built} manifests built in {took:.0f} s", flush=True)
            if args.fill_only:
                return status
            lookups = [_read_db.measure(url, job, rounds=args.rounds) for job in jobs]
            print(f"load average {load()}")
            print("\n".join(_read_db.table(lookups)))
    if args.plot and passes:
        plotted(plot_read_paths(passes, args.plot / "read_paths.png", args.s3_name))
    return status


@contextlib.contextmanager
def _s3_server(args: argparse.Namespace, fills: Sequence[Fill]) -> Iterator[tuple[str, int]]:
    """moto filled before it listens, or ``--s3-endpoint`` filled over HTTP (a bucket already
    filled is kept): its endpoint and its process id."""
    t0 = time.perf_counter()
    server = (
        contextlib.nullcontext((args.s3_endpoint, args.server_pid or 0))
        if args.s3_endpoint
        else filled_s3_process(fills)
    )
    with server as (endpoint, pid):
        if args.s3_endpoint:
            put_over_http(caller_s3(endpoint, 32), fills, workers=32)
        print(f"S3 ({args.s3_name}): {sum(f.count for f in fills):,} objects in"
              f" {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        yield endpoint, pid


def _verdicts(passes: Sequence[Pass]) -> int:
    by = {(p.shards, p.verify_by): p for p in passes}
    status = 0
    for (shards, how), p in sorted(by.items()):
        if how != "listing":
            continue
        limit = 10 if shards <= 4096 else 150 if shards <= 100_000 else math.inf
        head = by[(shards, "head")]
        goal = p.requests <= limit
        print(f"{shards:,} shards: {p.requests} requests (goal <= {limit}: "
              f"{'met' if goal else 'MISSED'}), {p.seconds:.1f} s by listing vs"
              f" {head.seconds:.1f} s by HEAD ({head.seconds / p.seconds:.0f}x)")  # fmt: skip
        status |= 0 if goal else 1
    return status
