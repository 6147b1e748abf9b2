"""Capacity: does the writer's cost per batch stay flat in the ranks of a checkpoint, and what
does a second writer add? Then the drain model for a checkpoint of that many ranks.

Run: ``python -m bench.capacity [--ranks 1000 4000 16000] [--schemas old delta slots]
[--batch-ms MS] [--admin-url URL]``.

Measured in this run, for every N of ``--ranks`` and every schema of ``--schemas`` side by side:
one checkpoint of N shards (one job, one step, world_size = N) written through the real
repository (``plan_batch`` + ``write_batch``) in 10-record batches on the local PostgreSQL, by 1
and by 2 writers (``--repeat`` times each, alternating with the other schemas; the fastest drain
kept). Each writer is its own process with its own connection, as two Lambda
execution environments are (threads would share one GIL), and takes every second batch; both
write the same checkpoint at once. Schema "old" is migrations 0001-0003 (each batch recounts all
shards of its checkpoint under the checkpoint's row lock); "delta" is 0001-0005 (0004: the
count moves by the batch's exact delta, the row lock is held only at the end of the statement;
0005: the same statement fed two json parameters instead of 20 arrays), written through 0005's
statement; "slots" is every migration (0006: the delta goes to the writing backend's own count
row, the checkpoint row is written only when raised or once complete, after the commit), written
through the repository. "delta-nosync" is "delta" with synchronous_commit off on the bench's
connections: a diagnostic of how much of the serialised tail is the commit's WAL flush.
``--batch-ms`` replaces the measured per-batch cost in the model by a production figure (e.g.
measured through RDS Proxy: add the round trip and the Lambda poller's receive/delete).

Then the AWS model (``--model-ranks``, default 10,000 and 100,000): one checkpoint barrier, every
rank sends its one report at once; drain time = the slowest of the send side, the receive/delete
side and the writers, in normal and in high-throughput FIFO mode, and which limit is hit first.
The writer's cost per batch in AWS = the database cost measured above (or ``--batch-ms``) + one
round trip through RDS Proxy (``--proxy-rtt-ms``) + the event source's per-invocation overhead
(``--invoke-ms``); a second writer adds what the 2-writer drain measured above added.

AWS figures used (the pages are cited where the numbers are defined):
* SQS FIFO, normal mode: 300 transactions/s per API action (SendMessage[Batch], ReceiveMessage,
  DeleteMessage[Batch]); a batch call carries up to 10 messages;
* SQS FIFO, high-throughput mode: 70,000 transactions/s per API action in us-east-1, us-west-2
  and eu-west-1 (less elsewhere, down to 2,400: ``--ht-tps``);
* Lambda's SQS event source: FIFO batches of at most 10 records, no batching window;
  concurrency <= min(active message groups, MaximumConcurrency);
* not published by AWS, so assumptions named as such: the event source's per-invocation
  overhead (receive, invoke, delete) and the round trip through RDS Proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection as Pipe
from multiprocessing.synchronize import Barrier

import psycopg

from bench import writer_throughput
from bench._writer_profile import (
    Write,
    apply_schema,
    commit_floor_ms,
    write_arrays,
    write_json_function,
)
from bench.writer_throughput import ADMIN_URL
from ckpt_contract import CheckpointReport, encode
from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer.connection import connect_url
from lambda_writer.planning import plan_batch
from lambda_writer.records import SqsMessage, ValidReport, classify
from lambda_writer.repository import write_batch

# Lambda's SQS event source: "For FIFO queues, the maximum is 10" (BatchSize), and "Batching window
# is not supported for FIFO queues":
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-parameters.html
BATCH = 10
# "By default, FIFO queues support 300 transactions per second, per API action for SendMessage,
# ReceiveMessage, and DeleteMessage"; batch actions carry up to 10 messages per call:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/troubleshooting-fifo-throttling-issues.html
FIFO_TPS_PER_ACTION = 300
# High-throughput FIFO (DeduplicationScope=messageGroup, FifoThroughputLimit=perMessageGroupId):
# 70,000 transactions/s per API action (700,000 messages/s in batches of 10) in US East (N.
# Virginia), US West (Oregon) and Europe (Ireland); other Regions lower (the smallest 2,400).
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
HT_FIFO_TPS_PER_ACTION = 70_000
# Lambda: "For FIFO queues, concurrent invocations are capped either by the number of message
# group IDs or by the maximum concurrency setting, whichever is lower."
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
# AWS publishes no figure for these two; they are assumptions, printed with every model line and
# meant to be replaced by measured ones (the writer's X-Ray trace: the Duration around the
# handler, and the database span):
DEFAULT_INVOKE_MS = 20.0  # poller ReceiveMessage + synchronous invoke + DeleteMessageBatch
DEFAULT_PROXY_RTT_MS = 1.0  # one statement per batch = one round trip through RDS Proxy

# Per schema: the highest migration applied (None = all of them), and whether the bench's
# connections turn synchronous_commit off ("delta-nosync": a diagnostic of how much of the
# serialised tail is the commit's WAL flush; never a configuration of the writer).
SCHEMAS: dict[str, tuple[int | None, bool]] = {
    "old": (3, False),
    "delta": (5, False),
    "delta-nosync": (5, True),
    "slots": (None, False),
}
# The schema of this release: the goals are judged on it, the AWS model uses its figures.
CURRENT = "slots"
# The statement each schema's writer sent: 0003 took 20 arrays, 0005 two json texts; the
# repository (this release) calls 0006's procedure.
WRITERS: dict[int | None, Write] = {3: write_arrays, 5: write_json_function, None: write_batch}
WARMUP_BATCHES = 20  # per connection, on another job: plpgsql's cached plans, catalog caches
TARGET_FLAT = 1.2  # mean per batch at the largest N within 20 % of the smallest N's
TARGET_SECOND_WRITER = 1.8


def checkpoint_reports(ranks: int, *, job_id: str = "capacity") -> list[ValidReport]:
    """One checkpoint (job, step 1) with one report per rank, as the writer decodes them."""
    now = datetime.now(UTC)
    out = []
    for rank in range(ranks):
        report = CheckpointReport.create(
            job_id=job_id, run_attempt=0, step=1, epoch=0, rank=rank, world_size=ranks,
            uri=f"s3://bench/capacity/step-1/rank-{rank}.pt", loss=0.5, created_at=now,
        )  # fmt: skip
        message = SqsMessage(
            message_id=str(uuid.uuid4()), body=encode(report), group_id=report.group_id,
            receive_count=1, first_receive_ms=None, sequence_number=None,
            source_arn="arn:aws:sqs:us-east-1:000000000000:capacity.fifo",
        )  # fmt: skip
        valid = classify(message)
        assert isinstance(valid, ValidReport)
        out.append(valid)
    return out


@dataclass(frozen=True)
class Drain:
    """One measured drain of the whole checkpoint."""

    writers: int
    seconds: float
    batch_ms: list[float]  # each batch's own duration, sorted

    def pct(self, q: float) -> float:
        return self.batch_ms[min(len(self.batch_ms) - 1, round(q * (len(self.batch_ms) - 1)))]

    @property
    def mean_ms(self) -> float:
        return sum(self.batch_ms) / len(self.batch_ms)


def _writer(
    url: str,
    batches: list[list[ValidReport]],
    warmup: list[list[ValidReport]],
    start: Barrier,
    results: Pipe,
    async_commit: bool,
    write: Write,
) -> None:
    """One writer process: warm its connection up, wait for the others, write, send timings."""
    with connect_url(url, autocommit=True) as conn:
        if async_commit:
            # Diagnostic only (bench connections, never the writer's): takes the WAL flush out
            # of the commit, to show how much of the serialised tail it is.
            conn.execute("SET synchronous_commit = off")
        for batch in warmup:
            write(conn, plan_batch(batch))
        start.wait()
        durations = []
        for batch in batches:
            began = time.perf_counter()
            write(conn, plan_batch(batch))
            durations.append(1000 * (time.perf_counter() - began))
    results.send(durations)
    results.close()


def measure_drain(
    url: str,
    reports: list[ValidReport],
    writers: int,
    *,
    async_commit: bool = False,
    write: Write = write_batch,
) -> Drain:
    """Write every batch with ``writers`` processes at once; per-batch and total time."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")
    batches = [reports[i : i + BATCH] for i in range(0, len(reports), BATCH)]
    # fork: the children inherit the decoded reports instead of unpickling 100,000 of them.
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(writers + 1)
    pipes, procs = [], []
    for w in range(writers):
        warmup = checkpoint_reports(WARMUP_BATCHES * BATCH, job_id=f"warmup-{w}")
        receiver, sender = ctx.Pipe(duplex=False)
        warm = [warmup[i : i + BATCH] for i in range(0, len(warmup), BATCH)]
        proc = ctx.Process(
            target=_writer,
            args=(url, batches[w::writers], warm, start, sender, async_commit, write),
        )
        proc.start()
        sender.close()
        pipes.append(receiver)
        procs.append(proc)
    start.wait()
    started = time.perf_counter()
    durations: list[float] = []
    for receiver in pipes:  # each child sends once, when its last batch committed
        durations.extend(receiver.recv())
    seconds = time.perf_counter() - started
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a writer process exited with {proc.exitcode}")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM training_checkpoint_shards WHERE job_id = 'capacity'),"
            " shards_present, is_complete FROM training_checkpoints WHERE job_id = 'capacity'"
        ).fetchone()
    if row is None or row[0] != len(reports) or row[1] != len(reports) or not row[2]:
        raise RuntimeError(f"drain with {writers} writers left the checkpoint wrong: {row}")
    return Drain(writers, seconds, sorted(durations))


def _fmt(seconds: float) -> str:
    return f"{seconds:7.1f} s" if seconds >= 1 else f"{1000 * seconds:5.0f} ms"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure_all(
    admin_url: str, ranks: Sequence[int], schemas: Sequence[str], repeat: int
) -> dict[tuple[str, int], tuple[Drain, Drain]]:
    """Drains with 1 and 2 writers for every (schema, N), printing each row as it is measured.

    1 and 2 writers alternate ``repeat`` times and the fastest drain of each is kept: the other
    work on a shared machine only ever slows a drain down.
    """
    print(f"{'N':>7} {'schema':12} {'writers':>7} {'drain':>9} {'per batch p50':>13}"
          f" {'p99':>7} {'mean':>7} {'2nd writer':>10} {'commit':>7}  load")  # fmt: skip
    out: dict[tuple[str, int], tuple[Drain, Drain]] = {}
    for n in ranks:
        reports = checkpoint_reports(n)
        runs: dict[tuple[str, int], list[Drain]] = {(s, w): [] for s in schemas for w in (1, 2)}
        floors: dict[str, list[float]] = {s: [] for s in schemas}
        with contextlib.ExitStack() as stack:
            urls = {}
            for schema in schemas:
                urls[schema] = stack.enter_context(
                    throwaway_database(admin_url, prefix="ckpt_capacity_")
                )
                apply_schema(urls[schema], SCHEMAS[schema][0])
            # Every repeat runs every schema and writer count in turn, so that the other work
            # on the machine, which comes and goes, falls on all of them alike.
            for _ in range(repeat):
                for schema in schemas:
                    floors[schema].append(commit_floor_ms(urls[schema]))
                    for writers in (1, 2):
                        runs[(schema, writers)].append(
                            measure_drain(
                                urls[schema],
                                reports,
                                writers,
                                async_commit=SCHEMAS[schema][1],
                                write=WRITERS[SCHEMAS[schema][0]],
                            )
                        )
        for schema in schemas:
            floor = min(floors[schema])
            one, two = (min(runs[(schema, w)], key=lambda d: d.seconds) for w in (1, 2))
            out[(schema, n)] = (one, two)
            for d in (one, two):
                gain = f"{one.seconds / two.seconds:9.2f}x" if d is two else ""
                print(
                    f"{n:7d} {schema:12} {d.writers:7d} {_fmt(d.seconds):>9}"
                    f" {d.pct(0.5):10.2f} ms {d.pct(0.99):7.2f} {d.mean_ms:7.2f} {gain:>10}"
                    f" {floor:4.2f} ms  {_load()}",
                    flush=True,
                )
    return out


def verdicts(drains: dict[tuple[str, int], tuple[Drain, Drain]], schema: str) -> bool:
    """Print the goals for ``schema``: flat per batch, linear drain, second writer >= 1.8x."""
    ns = sorted(n for s, n in drains if s == schema)
    if not ns:
        return True
    first, last = drains[(schema, ns[0])][0], drains[(schema, ns[-1])][0]
    flat = last.mean_ms / first.mean_ms
    per_k = ", ".join(f"{1000 * drains[(schema, n)][0].seconds / n:.3f}" for n in ns)
    gains = [drains[(schema, n)][0].seconds / drains[(schema, n)][1].seconds for n in ns]
    ok_flat = flat <= TARGET_FLAT
    ok_gain = min(gains) >= TARGET_SECOND_WRITER
    print(
        f"  {schema}: mean per batch at N={ns[-1]} / N={ns[0]} = {flat:.2f}"
        f" (target <= {TARGET_FLAT}): {'met' if ok_flat else 'MISSED'};"
        f" 1-writer drain per 1,000 ranks: {per_k} s (linear when constant);"
        f" second writer {min(gains):.2f}x..{max(gains):.2f}x (target >= {TARGET_SECOND_WRITER}):"
        f" {'met' if ok_gain else 'MISSED'}"
    )
    return ok_flat and ok_gain


@dataclass(frozen=True)
class AwsModel:
    """The drain of one checkpoint barrier on AWS, from the measured batch cost and AWS quotas."""

    db_batch_ms: float  # measured on the local database (or --batch-ms)
    second_writer_gain: float  # measured: 1-writer drain / 2-writer drain
    invoke_ms: float
    proxy_rtt_ms: float
    concurrency: int
    ht_tps: int

    def writer_s(self, batches: int) -> float:
        """The writers: ``concurrency`` invocations in flight, each one batch at a time; the
        database does at most ``gain`` batches at once of one checkpoint (its row lock)."""
        per_invocation_ms = self.invoke_ms + self.proxy_rtt_ms + self.db_batch_ms
        invocations_per_s = self.concurrency * 1000 / per_invocation_ms
        gain = 1.0 if self.concurrency == 1 else self.second_writer_gain
        database_per_s = gain * 1000 / self.db_batch_ms
        return batches / min(invocations_per_s, database_per_s)

    def database_s(self, batches: int) -> float:
        """The database's share alone: its measured batch cost, with the measured second-writer
        gain when there is more than one writer."""
        gain = 1.0 if self.concurrency == 1 else self.second_writer_gain
        return batches * self.db_batch_ms / 1000 / gain

    def drain(self, ranks: int, tps: int) -> tuple[float, dict[str, float]]:
        """(drain seconds, seconds per limit) for ``ranks`` one-message sends at once."""
        batches = math.ceil(ranks / BATCH)
        parts = {
            # Each rank sends its own report: one SendMessageBatch call with one entry.
            "SQS send": ranks / tps,
            # The poller: one ReceiveMessage (10 records) and one DeleteMessageBatch per batch,
            # each its own action with its own quota.
            "SQS receive/delete": batches / tps,
            "writers": self.writer_s(batches),
        }
        return max(parts.values()), parts


def print_model(model: AwsModel, ranks: Sequence[int], source: str) -> None:
    """One line per (ranks, FIFO mode): the drain after a barrier and the limit hit first."""
    print(
        f"  AWS model: writer concurrency {model.concurrency}, per batch = database"
        f" {model.db_batch_ms:.2f} ms ({source}) + RDS Proxy round trip {model.proxy_rtt_ms:.1f}"
        f" ms (assumption) + event source overhead {model.invoke_ms:.0f} ms per invocation"
        f" (assumption); second writer {model.second_writer_gain:.2f}x (measured above)"
    )
    for n in ranks:
        for mode, tps in (("normal", FIFO_TPS_PER_ACTION), ("high-throughput", model.ht_tps)):
            total, parts = model.drain(n, tps)
            first = max(parts, key=lambda k: parts[k])
            detail = ", ".join(f"{k} {_fmt(v).strip()}" for k, v in parts.items())
            print(
                f"    {n:7d} ranks, FIFO {mode:15} ({tps}/s per action): {detail}"
                f" -> drain ~{_fmt(total).strip()}, limit hit first: {first}"
            )
        batches = math.ceil(n / BATCH)
        database_s = model.database_s(batches)
        bound = (
            "the database"
            if database_s >= model.writer_s(batches)
            else f"the time per invocation at concurrency {model.concurrency}"
        )
        print(
            f"    {n:7d} ranks: of the writers' time, the database alone (no invocation overhead,"
            f" no proxy) would take {_fmt(database_s).strip()}: the writers are bound by {bound}"
        )


def throughput_batch_ms(admin_url: str, rows: int = 3000) -> float:
    """Mean ms per batch of 10 of bench.writer_throughput's repository path (cross-check)."""
    reports = writer_throughput.make_reports(rows)
    run = writer_throughput.run_repository
    with throwaway_database(admin_url, prefix="ckpt_capacity_") as url:
        apply_schema(url, None)
        with connect_url(url, autocommit=True) as conn:
            run(conn, reports[:200], BATCH)  # warm-up
            rate = writer_throughput.timed(conn, reports, lambda: run(conn, reports, BATCH))
    return 1000 * BATCH / rate


def main(argv: Sequence[str] | None = None) -> int:
    """Measure per-batch cost and drains, then print the drain model and its bottleneck."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--schemas", nargs="+", choices=list(SCHEMAS), default=list(SCHEMAS))
    parser.add_argument("--repeat", type=int, default=2, help="drains per case; fastest kept")
    parser.add_argument(
        "--batch-ms", type=float, default=None,
        help="database cost per batch to model (default: the 1-writer drain measured here)",
    )  # fmt: skip
    parser.add_argument("--model-ranks", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--concurrency", type=int, default=2, help="writer concurrency on AWS")
    parser.add_argument(
        "--invoke-ms", type=float, default=DEFAULT_INVOKE_MS,
        help=f"event source overhead per invocation (default {DEFAULT_INVOKE_MS}, an assumption)",
    )  # fmt: skip
    parser.add_argument(
        "--proxy-rtt-ms", type=float, default=DEFAULT_PROXY_RTT_MS,
        help=f"round trip Lambda -> RDS Proxy -> DB (default {DEFAULT_PROXY_RTT_MS}, assumption)",
    )  # fmt: skip
    parser.add_argument(
        "--ht-tps", type=int, default=HT_FIFO_TPS_PER_ACTION,
        help="high-throughput FIFO transactions/s per API action of the Region"
        f" (default {HT_FIFO_TPS_PER_ACTION}: us-east-1, us-west-2, eu-west-1)",
    )  # fmt: skip
    parser.add_argument(
        "--admin-url", default=os.environ.get("CKPT_BENCH_ADMIN_URL", ADMIN_URL),
        help="server to create the throwaway databases on",
    )  # fmt: skip
    args = parser.parse_args(argv)
    print(
        f"capacity: one checkpoint of N ranks in FIFO batches of {BATCH}, real repository, 1 and"
        f" 2 writer processes; {os.cpu_count()} CPUs, load average at start {_load()} (other work"
        " on this machine shares the cores)",
        flush=True,
    )
    print(
        "  commit = mean autocommitted one-row INSERT on the same database: the WAL flush every"
        " batch pays (old, delta: inside the checkpoint row lock; slots: under no shared lock)",
        flush=True,
    )
    drains = measure_all(args.admin_url, args.ranks, args.schemas, args.repeat)
    # Every schema's verdicts are printed side by side; the exit status is this release's.
    oks = {schema: verdicts(drains, schema) for schema in args.schemas}
    schema = CURRENT if CURRENT in args.schemas else args.schemas[0]
    ok = oks[schema]
    one, two = drains[(schema, max(args.ranks))]
    local_batch_ms = one.seconds * 1000 / math.ceil(max(args.ranks) / BATCH)
    print(
        f"  local check, schema {schema}: 1-writer drain {local_batch_ms:.2f} ms per batch at"
        f" N={max(args.ranks)} vs {throughput_batch_ms(args.admin_url):.2f} ms per batch of the"
        " writer_throughput path (repository, batch 10, 3000 rows, same server, this run)",
        flush=True,
    )
    batch_ms = args.batch_ms if args.batch_ms is not None else local_batch_ms
    model = AwsModel(
        db_batch_ms=batch_ms,
        second_writer_gain=one.seconds / two.seconds,
        invoke_ms=args.invoke_ms,
        proxy_rtt_ms=args.proxy_rtt_ms,
        concurrency=args.concurrency,
        ht_tps=args.ht_tps,
    )
    source = "--batch-ms" if args.batch_ms is not None else f"measured above, N={max(args.ranks)}"
    print_model(model, args.model_ranks, source)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
