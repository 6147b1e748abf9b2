"""Fan-in: N ranks x 5 checkpoints, the pipeline beside the seed's direct-write design.

Run: ``python -m bench.fanin [--ranks 64 256 1024] [--checkpoints 5] [--ranks-per-process K]
[--sqs moto|localstack]``.

Both designs run in one invocation against one throwaway PostgreSQL cluster capped like the
seed's RDS instance (max_connections 30, so 27 slots for non-superusers), each in its own
database, the application roles with the seed's 5 s statement_timeout:

* pipeline: every rank a thread with its own ``CheckpointReporter`` (own spool and sender
  thread; the ranks of a process share one boto3 client, see :mod:`bench._ranks`) reporting at
  a barrier; the SQS emulator (moto or LocalStack) in its own process; the real writer at
  concurrency 2 driven by the local event source, logged in as ``ckpt_writer`` (5 s timeout).
  Ranks run in ``ceil(N / ranks-per-process)`` spawned processes, by default one per core, whose
  GIL switch interval is raised to 50 ms (``--switch-interval-ms``; why:
  ``bench._ranks.SWITCH_INTERVAL_VAR``). More rank processes than cores cost more than they
  give (4,096 ranks in 8 processes took 156.6 s and 10.4 ms of rank CPU per report, in 2
  processes 73.4 s and 3.1 ms; BENCHMARKS §1); the likely cause, not measured: a process the
  scheduler sets aside keeps its GIL while its runnable ranks wait.
* direct write: :func:`ckpt_pipeline.demo.direct_write.run_direct_write`, every rank its own pool of
  5 connections UPSERTing at the barrier, as ``seed_app`` (5 s timeout), threads of this process.

Clocks: "all rows" runs from the first checkpoint's barrier release (every reporter built) to
the moment every shard row and every complete checkpoint is in the database. Over the same span
the "pipeline CPU" row splits the machine's CPU between the parts (:class:`CpuSplit`), and the
"SQS floor" row gives the emulator's own CPU for the same messages sent by a bare client: on one
machine of 2 cores, N simulated ranks, the emulator and the writer share the cores that on AWS
are N hosts, SQS and Lambda.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench._cpu import CpuSplit, PartsCpu, listening_pid, process_cpu_s
from bench._ranks import (
    READ_TIMEOUT_VAR,
    SWITCH_INTERVAL_VAR,
    RankProcesses,
    WorkerResult,
    fanin_worker,
    split,
)
from bench._services import sqs_process
from ckpt_contract.message import CheckpointReport, encode
from ckpt_pipeline.demo.direct_write import APPLICATION_NAME, DirectWriteResult, run_direct_write
from ckpt_pipeline.demo.fanin import count_rows, fanin_step, fanin_uri
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.embedded_pg import (
    ThrowawayCluster,
    create_login_role,
    start_throwaway_cluster,
)
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, local_pipeline
from ckpt_pipeline.local.sqs_server import create_pipeline_queues
from ckpt_pipeline.ops.sqs import sqs_client
from lambda_writer.connection import connect_url
from lambda_writer.migrate import apply_migrations

SEED_MAX_CONNECTIONS = 30
SEED_STATEMENT_TIMEOUT = "5s"
SEED_POOL_SIZE = 5
APP_ROLE = "seed_app"
WRITER_ROLE = "ckpt_writer"
DEFAULT_RANKS = (64, 256, 1024)
GOAL_MAX_WRITER_CONNECTIONS = 2
_POLL_S = 0.1


@dataclass(frozen=True)
class PipelineRun:
    """One pipeline fan-in: what was reported, what reached the database, and when."""

    ranks: int
    checkpoints: int
    processes: int
    ready_s: float
    reported: int
    errors: Counter[str]
    unflushed_ranks: int
    rows: int
    complete: int
    all_rows_s: float | None
    after_last_barrier_s: float | None
    all_acked_s: float
    peak_writer: int
    dlq: int
    retried_records: int
    batches: int
    cpu: CpuSplit  # from the first barrier until every row is in (or the timeout)
    build_cpu_ms_per_rank: float = 0.0
    build_mb_per_rank: float = 0.0

    @property
    def expected(self) -> int:
        return self.ranks * self.checkpoints

    @property
    def failures(self) -> int:
        return sum(self.errors.values()) + (self.expected - self.rows)


@dataclass(frozen=True)
class DirectRun:
    """One direct-write fan-in."""

    result: DirectWriteResult
    rows: int
    peak: int


def _migrated_database(cluster: ThrowawayCluster, prefix: str, role: str) -> tuple[str, str]:
    db = cluster.create_database(f"{prefix}_{uuid.uuid4().hex[:8]}")
    with connect_url(db) as conn:
        apply_migrations(conn)
    role_url = create_login_role(
        cluster.admin_url, db, role, statement_timeout=SEED_STATEMENT_TIMEOUT
    )
    return db, role_url


def run_pipeline(
    cluster: ThrowawayCluster,
    endpoint: str,
    *,
    ranks: int,
    checkpoints: int,
    ranks_per_process: int,
    spool_dir: Path,
    timeout_s: float,
) -> PipelineRun:
    """Fan ``ranks`` reporters in through the whole local pipeline; wait for every row."""
    db, writer_url = _migrated_database(cluster, "pipe", WRITER_ROLE)
    job = f"fanin-{ranks}"
    with (
        local_pipeline(db, endpoint_url=endpoint, writer_database_url=writer_url) as pipe,
        PeakConnections(db) as peak,
    ):
        chunks = split(ranks, ranks_per_process)
        args = [
            (pipe.client_env(), pipe.queues.queue_url, job, chunk, ranks, checkpoints,
             str(spool_dir))
            for chunk in chunks
        ]  # fmt: skip
        parts = PartsCpu(endpoint, cluster.data_dir, lambda: pipe.writer_cpu.seconds)
        with RankProcesses(fanin_worker, args, flush_timeout_s=timeout_s) as procs:
            first = last = procs.release()
            # After the release: the reporters' build (before it) is not the fan-in's.
            before = parts.read()
            broken = False
            try:
                for _ in range(checkpoints - 1):
                    last = procs.release()
            except threading.BrokenBarrierError:
                # A rank failed and aborted the barrier: its error comes back with the results.
                broken = True
            all_rows_at = None
            deadline = first + (0.0 if broken else timeout_s)
            while time.monotonic() < deadline:
                rows, complete = count_rows(db, job)
                if rows >= ranks * checkpoints and complete >= checkpoints:
                    all_rows_at = time.monotonic()
                    break
                time.sleep(_POLL_S)
            after = parts.read()
            workers = procs.results(60.0 if broken else timeout_s)
        rows, complete = count_rows(db, job)
        stats = pipe.source.stats
        dlq = pipe.dlq_depth()
    errors: Counter[str] = Counter()
    for w in workers:
        errors.update(w.errors)
    missing_workers = len(chunks) - len(workers)
    if missing_workers:
        errors[f"worker process gave no result x{missing_workers}"] += 1
    return PipelineRun(
        ranks=ranks,
        checkpoints=checkpoints,
        processes=len(chunks),
        ready_s=max((w.ready_s for w in workers), default=0.0),
        reported=sum(w.reported for w in workers),
        errors=errors,
        unflushed_ranks=sum(w.unflushed_ranks for w in workers),
        rows=rows,
        complete=complete,
        all_rows_s=None if all_rows_at is None else all_rows_at - first,
        after_last_barrier_s=None if all_rows_at is None else all_rows_at - last,
        all_acked_s=max((w.flushed_at for w in workers), default=first) - first,
        peak_writer=peak.peak(WRITER_APPLICATION_NAME),
        dlq=dlq,
        retried_records=stats.failed_records,
        batches=stats.batches,
        build_cpu_ms_per_rank=1000 * sum(w.build_cpu_s for w in workers) / ranks,
        build_mb_per_rank=sum(w.build_rss_mb for w in workers) / ranks,
        # The rank processes' CPU after their reporters were built: the barriers, the reports,
        # the sends and the final flush (which ends with the last acknowledgement, i.e. at most
        # a poll interval after the last row is in).
        cpu=PartsCpu.split(before, after, sum(w.cpu_s - w.build_cpu_s for w in workers)),
    )


def emulator_floor(
    endpoint: str, *, ranks: int, checkpoints: int, threads: int = 64
) -> tuple[float, float]:
    """Seconds for a bare boto3 client to send the same messages (one SendMessageBatch per rank
    and checkpoint, as the reporters send them, from ``threads`` threads) and then receive and
    delete them all (2 consumers, batches of 10): the emulator's own floor, no spool, no writer.
    With it, the emulator process's CPU seconds meanwhile (NaN if its process was not found)."""
    emulator = listening_pid(int(endpoint.rsplit(":", 1)[1]))
    sqs = sqs_client(endpoint)
    q = create_pipeline_queues(sqs, prefix=f"floor-{uuid.uuid4().hex[:8]}")
    now = datetime.now(UTC)
    reports = [
        CheckpointReport.create(
            job_id=f"floor-{ranks}", run_attempt=0, step=fanin_step(c), epoch=c,
            world_size=ranks, rank=r, uri=fanin_uri(fanin_step(c), r), loss=0.5, created_at=now,
        )
        for c in range(checkpoints) for r in range(ranks)
    ]  # fmt: skip

    def send(rep: CheckpointReport) -> None:
        sqs.send_message_batch(
            QueueUrl=q.queue_url,
            Entries=[{"Id": "0", "MessageBody": encode(rep), "MessageGroupId": rep.group_id,
                      "MessageDeduplicationId": rep.dedup_id}],
        )  # fmt: skip

    def drain(total: list[int]) -> None:
        while total[0] < len(reports):
            msgs = sqs.receive_message(
                QueueUrl=q.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            if msgs:
                sqs.delete_message_batch(
                    QueueUrl=q.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                             for i, m in enumerate(msgs)],
                )  # fmt: skip
                with lock:
                    total[0] += len(msgs)
                    # The moment the last message is deleted (not the other consumer's idle
                    # long poll that follows).
                    done.append(time.monotonic())

    lock = threading.Lock()
    done: list[float] = []
    emulator0 = process_cpu_s(emulator) if emulator else math.nan
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, reports))
    total = [0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(drain, total) for _ in range(2)]:
            f.result()
    seconds = max(done) - started
    return seconds, (process_cpu_s(emulator) - emulator0) if emulator else math.nan


def run_direct(cluster: ThrowawayCluster, *, ranks: int, checkpoints: int) -> DirectRun:
    """The seed's design: every rank its own pool of 5, UPSERT at the barrier."""
    db, app_url = _migrated_database(cluster, "seed", APP_ROLE)
    job = f"seed-{ranks}"
    with PeakConnections(db) as peak:
        result = run_direct_write(
            app_url, job_id=job, ranks=ranks, checkpoints=checkpoints, pool_size=SEED_POOL_SIZE
        )
    rows, _ = count_rows(db, job)
    return DirectRun(result=result, rows=rows, peak=peak.peak(APPLICATION_NAME))


_HEADER = (
    f"{'N':>5} {'design':14} {'written':>11} {'failed':>7} {'peak conn':>9} "
    f"{'all rows in DB':>15}  notes"
)


def _pipeline_line(r: PipelineRun) -> str:
    when = "never" if r.all_rows_s is None else f"{r.all_rows_s:.1f} s"
    notes = (
        f"{r.processes} proc, reporters built in {r.ready_s:.1f} s; all sent+acked by SQS at"
        f" {r.all_acked_s:.1f} s; last barrier -> all rows "
        + ("never" if r.after_last_barrier_s is None else f"{r.after_last_barrier_s:.1f} s")
        + f"; {r.batches} batches, {r.retried_records} records retried, DLQ {r.dlq}"
        + f"; reporter build {r.build_cpu_ms_per_rank:.1f} ms CPU, {r.build_mb_per_rank:.2f} MB"
        " per rank" + (f", {r.unflushed_ranks} ranks unflushed" if r.unflushed_ranks else "")
    )
    return (
        f"{r.ranks:5d} {'pipeline':14} {r.rows:5d}/{r.expected:<5d} {r.failures:7d} "
        f"{r.peak_writer:>3d} writer {when:>15}  {notes}"
    )


def _cpu_line(r: PipelineRun) -> str:
    """Where the cores went from the first barrier until every row was in."""
    c = r.cpu
    cores = os.cpu_count() or 1
    rows = max(r.rows, 1)
    parts = (
        ("ranks", c.ranks_s), ("event source", c.source_s), ("writer", c.writer_s),
        ("postgres", c.postgres_s), ("emulator", c.emulator_s),
    )  # fmt: skip
    split = ", ".join(f"{name} {s:.1f} s ({1000 * s / rows:.2f})" for name, s in parts)
    return (
        f"{r.ranks:5d} {'pipeline CPU':14} {c.wall_s:.1f} s on {cores} cores, busy"
        f" {100 * c.busy_share(cores):.0f} %, steal {100 * c.steal_s / (cores * c.wall_s):.0f} %;"
        f" CPU s (ms per row): {split}"
    )


def _direct_line(d: DirectRun) -> str:
    r = d.result
    when = "never" if d.rows < r.attempted else f"{r.elapsed_s:.1f} s"
    return (
        f"{r.ranks:5d} {'direct write':14} {d.rows:5d}/{r.attempted:<5d} {r.failed:7d} "
        f"{d.peak:>9d} {when:>15}  ran {r.elapsed_s:.1f} s, wanted {r.ranks * SEED_POOL_SIZE}"
        f" connections"
    )


def _kinds(errors: Counter[str]) -> list[str]:
    return [f"        x{n}: {kind}" for kind, n in errors.most_common(4)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run both designs at every N, printing each row as it finishes; 1 if the goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=list(DEFAULT_RANKS))
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--sqs", choices=["moto", "localstack"], default="moto")
    parser.add_argument("--no-direct", action="store_true", help="skip the direct-write rows")
    parser.add_argument(
        "--ranks-per-process",
        type=int,
        default=None,
        help="simulated ranks per process (default: N / cores, i.e. one process per core)",
    )
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per pipeline run")
    parser.add_argument(
        "--client-read-timeout-s",
        type=float,
        default=None,
        help="reporters' SQS read timeout (default the client's 5 s); moto slows with queue"
        " depth, and at N >= 256 a 5 s timeout turns its slowness into a resend storm",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=50.0,
        help="sys.setswitchinterval of the rank processes (default 50; CPython's own is 5):"
        " hundreds of simulated ranks share one GIL there, which no real rank does",
    )
    args = parser.parse_args(argv)
    if args.ranks_per_process is not None and args.ranks_per_process < 1:
        parser.error(f"--ranks-per-process must be at least 1, got {args.ranks_per_process}")
    if not args.switch_interval_ms > 0:
        parser.error(f"--switch-interval-ms must be above 0, got {args.switch_interval_ms:g}")
    if args.client_read_timeout_s is not None:
        os.environ[READ_TIMEOUT_VAR] = str(args.client_read_timeout_s)  # the rank processes'
    os.environ[SWITCH_INTERVAL_VAR] = str(args.switch_interval_ms / 1000)
    print(
        f"fan-in: {args.checkpoints} checkpoints at a barrier; PostgreSQL max_connections"
        f" {SEED_MAX_CONNECTIONS}, statement_timeout {SEED_STATEMENT_TIMEOUT} (roles"
        f" {WRITER_ROLE}, {APP_ROLE}); pipeline writer concurrency 2; direct write pool"
        f" {SEED_POOL_SIZE}/rank; ranks per process <= {args.ranks_per_process or 'N / cores'},"
        " their GIL switch"
        f" interval {args.switch_interval_ms:g} ms; SQS {args.sqs};"
        f" load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on this"
        " machine shares the cores)",
        flush=True,
    )
    print(_HEADER, flush=True)
    goal_met = True
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-fanin-") as tmp,
        start_throwaway_cluster(max_connections=SEED_MAX_CONNECTIONS) as cluster,
        sqs_process(args.sqs) as endpoint,
    ):
        for n in args.ranks:
            spool = Path(tmp) / f"spool-{n}"
            spool.mkdir()
            pipe = run_pipeline(
                cluster, endpoint, ranks=n, checkpoints=args.checkpoints,
                ranks_per_process=args.ranks_per_process or -(-n // (os.cpu_count() or 1)),
                spool_dir=spool,
                timeout_s=args.timeout_s,
            )  # fmt: skip
            print(_pipeline_line(pipe), flush=True)
            print(_cpu_line(pipe), flush=True)
            print("\n".join(_kinds(pipe.errors)), end="\n" if pipe.errors else "", flush=True)
            goal_met = goal_met and pipe.failures == 0 and pipe.dlq == 0
            goal_met = goal_met and pipe.peak_writer <= GOAL_MAX_WRITER_CONNECTIONS
            messages = n * args.checkpoints
            floor, floor_cpu = emulator_floor(endpoint, ranks=n, checkpoints=args.checkpoints)
            ratio = "n/a" if pipe.all_rows_s is None else f"{pipe.all_rows_s / floor:.1f}x"
            print(
                f"{n:5d} {'SQS floor':14} bare client send+receive+delete of the same"
                f" {messages} messages: {floor:.1f} s, emulator CPU {floor_cpu:.1f} s"
                f" ({1000 * floor_cpu / messages:.2f} ms per message); pipeline/floor {ratio};"
                f" load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            if not args.no_direct:
                direct = run_direct(cluster, ranks=n, checkpoints=args.checkpoints)
                print(_direct_line(direct), flush=True)
                print("\n".join(_kinds(direct.result.errors)), flush=True)
    print(
        f"goal (pipeline 0 failures, <= {GOAL_MAX_WRITER_CONNECTIONS} writer connections at"
        f" every N): {'met' if goal_met else 'MISSED'}",
        flush=True,
    )
    return 0 if goal_met else 1


__all__ = ["DirectRun", "PipelineRun", "WorkerResult", "main", "run_direct", "run_pipeline"]

if __name__ == "__main__":
    sys.exit(main())
