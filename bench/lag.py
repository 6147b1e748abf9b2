"""End-to-end lag at a steady rate: report() call -> shard row committed, through the pipeline.

Run: ``python -m bench.lag [--rates 25 50 100 200 300 500] [--seconds 20] [--ranks 50]
[--processes 2] [--sqs moto|localstack]``.

Warm-up (``--warmup-s``, default 5 s): each rate's fresh pipeline first runs that rate unmeasured
for a few seconds, printed as its own row. A fresh pipeline's first seconds hold one-time costs:
LocalStack stalls once for ~0.5 s early in its life (every sender's requests wait: the slow rows'
report()->SQS hop), and each event-source worker's first invocation is the writer's cold start
(BENCHMARKS.md §5). With 20 s phases they were the whole p99 at 25–100 msg/s (0.4–0.6 s);
measured after them the same rate's p99 was 13 ms. A deployed pipeline is warm; its cold starts
are §5's figure.

Where the slow rows' time goes: for the slowest 1 % of each rate's rows, the median of each hop,
from what SQS and the writer saw of every record: report() -> SQS accepted it (the record's
``SentTimestamp``: the client's spool and send), -> first received
(``ApproximateFirstReceiveTimestamp``: the queue), -> the invocation started (the event source),
-> the commit (the writer); and how many
of them were their rank's first report of the run (the rank process's first sends pay its SQS
client's lazy set-up) or in an event-source worker's first invocation (the writer's cold start).
SQS's timestamps are milliseconds on this machine's clock.

Lag of a row = PostgreSQL's commit timestamp of the transaction that wrote it
(``pg_xact_commit_timestamp(xmin)``, with ``track_commit_timestamp = on`` on the throwaway
cluster) minus the row's ``reported_at``, which the client stamps inside ``report()``
(``created_at``). Both clocks are this machine's, so there is no skew. The commit time is used
rather than ``updated_at``/``written_at``: those are ``now()``, the transaction's start, which
leaves out the statement itself and the commit.

The senders are open loop: every rank reports on a fixed schedule (ranks evenly phase-shifted)
whatever the pipeline does, so a pipeline that cannot keep up shows growing lag and backlog
instead of a politely lowered rate. The SQS emulator runs in its own process, the ranks in
``--processes`` spawned processes, the event source and writer (concurrency 2) in this one: all
on the same cores. CPU per message per part: the rank processes' (client), this process's minus
the writer handler threads' (event source, with the depth sampling), the handler threads'
(writer, Python side), the throwaway cluster's postmaster and backends (postgres: the writer's
statements and commits, the lag query at the end not included), the emulator process's.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from botocore.exceptions import BotoCoreError, ClientError

from bench import _sqs
from bench._cpu import CpuSplit, PartsCpu
from bench._ranks import RankProcesses, RankSetup, paced_worker, split
from ckpt_pipeline.local.embedded_pg import start_throwaway_cluster
from ckpt_pipeline.local.pipeline import LocalPipeline, local_pipeline
from ckpt_pipeline.local.sqs_server import SqsKind, sqs_emulator

JOB = "lag"
DEFAULT_RATES = (25.0, 50.0, 100.0, 200.0, 300.0, 500.0)
HELD_P99_S = 1.0
STEP_STRIDE = 1_000_000  # phase p uses steps p*STRIDE + k

LAG_SQL = """
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
       max(lag)
FROM (SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - reported_at)::float8 AS lag
      FROM training_checkpoint_shards
      WHERE job_id = %(job)s AND step >= %(lo)s AND step < %(hi)s) AS rows
"""


@dataclass(frozen=True)
class LagPhase:
    """One rate's figures."""

    target_rate: float
    seconds: float
    reported: int
    max_slip_s: float
    rows: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    max_backlog: int
    end_backlog: int | None
    sqs_unanswered: int
    drained_after_s: float | None
    # CPU seconds from the release to the drain, per part (the writer's is its handler threads').
    cpu_client_s: float = 0.0
    cpu_source_s: float = 0.0
    cpu_writer_s: float = 0.0
    cpu_emulator_s: float = 0.0
    cpu_postgres_s: float = 0.0  # the cluster's postmaster and backends (the writer's SQL)
    tail: TailSplit | None = None
    warmup: bool = False  # the fresh pipeline's first seconds, not measured

    @property
    def achieved_rate(self) -> float:
        return self.reported / self.seconds


def _depth(pipe: LocalPipeline) -> int | None:
    """Queue depth, or None when moto does not answer (it stalls under overload)."""
    try:
        return pipe.depth()
    except (BotoCoreError, ClientError):
        return None


class _BacklogSampler:
    """Samples the main queue's depth (visible + in flight) in the background."""

    def __init__(self, pipe: LocalPipeline) -> None:
        self._pipe = pipe
        self._stop = threading.Event()
        self.max_depth = 0
        self.unanswered = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            depth = _depth(self._pipe)
            if depth is None:
                self.unanswered += 1
            else:
                self.max_depth = max(self.max_depth, depth)

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join()
        return _depth(self._pipe)


TIMELINE_SQL = """
SELECT sqs_message_id, rank, extract(epoch FROM reported_at)::float8,
       extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8
FROM training_checkpoint_shards
WHERE job_id = %(job)s AND step >= %(lo)s AND step < %(hi)s
"""


@dataclass
class _Invocations:
    """What the writer saw of each record: SQS's timestamps, when its invocation started, and
    whether that was the first invocation of its event-source worker."""

    seen: dict[str, tuple[float, float, float, bool]] = field(default_factory=dict)
    _threads: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, event: dict[str, Any], started: float) -> None:
        thread = threading.get_ident()
        with self._lock:
            first = thread not in self._threads
            self._threads.add(thread)
            for record in event.get("Records", []):
                attributes = record.get("attributes", {})
                self.seen[record["messageId"]] = (
                    int(attributes.get("SentTimestamp", 0)) / 1000,
                    int(attributes.get("ApproximateFirstReceiveTimestamp", 0)) / 1000,
                    started,
                    first,
                )


@dataclass(frozen=True)
class TailSplit:
    """The slowest 1 % of a rate's rows: the median of each hop, and what they have in common."""

    rows: int
    to_sqs_ms: float
    queued_ms: float
    to_invoke_ms: float
    to_commit_ms: float
    first_of_rank: int
    cold_worker: int

    def __str__(self) -> str:
        return (
            f"slowest 1 % ({self.rows} rows), median ms: report()->SQS {self.to_sqs_ms:.0f},"
            f" queued {self.queued_ms:.0f}, ->invocation {self.to_invoke_ms:.0f},"
            f" ->commit {self.to_commit_ms:.0f}; their rank's first report: {self.first_of_rank},"
            f" in a worker's first invocation: {self.cold_worker}"
        )


def _tail_split(db: str, phase: int, seen: _Invocations) -> TailSplit | None:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            TIMELINE_SQL, {"job": JOB, "lo": phase * STEP_STRIDE, "hi": (phase + 1) * STEP_STRIDE}
        ).fetchall()
    first_report: dict[int, float] = {}
    for _, rank, reported, _ in rows:
        first_report[rank] = min(reported, first_report.get(rank, reported))
    timed = [
        (committed - reported, reported, rank, seen.seen[mid], committed)
        for mid, rank, reported, committed in rows
        if mid in seen.seen and committed is not None
    ]
    if not timed:
        return None
    timed.sort(key=lambda t: t[0], reverse=True)
    tail = timed[: max(1, len(timed) // 100)]

    def median_ms(values: list[float]) -> float:
        return 1000 * statistics.median(values)

    return TailSplit(
        rows=len(tail),
        to_sqs_ms=median_ms([s[0] - reported for _, reported, _, s, _ in tail]),
        queued_ms=median_ms([s[1] - s[0] for _, _, _, s, _ in tail]),
        to_invoke_ms=median_ms([s[2] - s[1] for _, _, _, s, _ in tail]),
        to_commit_ms=median_ms([committed - s[2] for _, _, _, s, committed in tail]),
        first_of_rank=sum(1 for _, reported, rank, _, _ in tail if reported == first_report[rank]),
        cold_worker=sum(1 for _, _, _, s, _ in tail if s[3]),
    )


def _lag(db: str, phase: int) -> tuple[int, float | None, float | None, float | None]:
    with psycopg.connect(db) as conn:
        row = conn.execute(
            LAG_SQL, {"job": JOB, "lo": phase * STEP_STRIDE, "hi": (phase + 1) * STEP_STRIDE}
        ).fetchone()
    assert row is not None
    return int(row[0]), row[1], row[2], row[3]


def run_lag(
    *,
    rates: Sequence[float],
    seconds: float,
    ranks: int,
    processes: int,
    drain_timeout_s: float,
    sqs: SqsKind = "moto",
    warmup_s: float = 0.0,
) -> list[LagPhase]:
    """Each rate for ``seconds``, then wait until its rows are in; one row of figures each.

    ``warmup_s`` > 0 runs the first rate that long first, as a row of its own (``warmup``).
    """
    plan = [(float(rates[0]), warmup_s)] if warmup_s > 0 else []
    plan += [(float(rate), seconds) for rate in rates]
    phases = [(rate, secs, p * STEP_STRIDE) for p, (rate, secs) in enumerate(plan)]
    measured: list[tuple[int, float, float, int, int | None, int, float | None]] = []
    cpu: list[CpuSplit] = []
    phases_out: list[LagPhase] = []
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-lag-") as spool,
        start_throwaway_cluster(settings={"track_commit_timestamp": "on"}) as cluster,
        sqs_emulator(sqs) as endpoint,
    ):
        db = cluster.create_database("lag")
        invocations = _Invocations()
        with local_pipeline(db, endpoint_url=endpoint, observer=invocations.observe) as pipe:
            chunks = split(ranks, -(-ranks // processes))
            setup = RankSetup(pipe.client_env(), pipe.queues.queue_url, JOB, ranks, spool)
            parts = PartsCpu(endpoint, cluster.data_dir, lambda: pipe.writer_cpu.seconds)
            with RankProcesses(paced_worker, setup, chunks, phases, flush_timeout_s=120) as procs:
                for p, (rate, secs, _) in enumerate(phases):
                    before = parts.read()
                    procs.release()
                    sampler = _BacklogSampler(pipe)
                    time.sleep(secs + 0.5)  # the phase runs on the workers' schedule
                    end_backlog = sampler.stop()
                    finished = time.monotonic()
                    drained_after = None
                    while time.monotonic() - finished < drain_timeout_s:
                        if _depth(pipe) == 0:
                            drained_after = time.monotonic() - finished
                            break
                        time.sleep(0.2)
                    # The rank processes report their own CPU per phase (cpu_client_s below).
                    cpu.append(PartsCpu.split(before, parts.read(), ranks_s=math.nan))
                    measured.append(
                        (p, rate, secs, sampler.max_depth, end_backlog, sampler.unanswered,
                         drained_after)
                    )  # fmt: skip
                workers = procs.results(120)
            for p, rate, secs, max_backlog, end_backlog, unanswered, drained_after in measured:
                rows, p50, p99, mx = _lag(db, p)
                phases_out.append(
                    LagPhase(
                        target_rate=rate,
                        seconds=secs,
                        reported=sum(w.phase_reported[p] for w in workers),
                        max_slip_s=max((w.phase_max_slip_s[p] for w in workers), default=0.0),
                        rows=rows,
                        p50_s=p50,
                        p99_s=p99,
                        max_s=mx,
                        max_backlog=max_backlog,
                        end_backlog=end_backlog,
                        sqs_unanswered=unanswered,
                        drained_after_s=drained_after,
                        cpu_client_s=sum(
                            w.phase_cpu_s[p] if p < len(w.phase_cpu_s) else 0.0 for w in workers
                        ),
                        cpu_source_s=cpu[p].source_s,
                        cpu_writer_s=cpu[p].writer_s,
                        cpu_emulator_s=cpu[p].emulator_s,
                        cpu_postgres_s=cpu[p].postgres_s,
                        tail=_tail_split(db, p, invocations),
                        warmup=warmup_s > 0 and p == 0,
                    )
                )
            errors = [e for w in workers for e in w.errors]
            if errors or len(workers) < len(chunks):
                print(f"  sender errors: {errors[:3]}, workers reporting: {len(workers)}")
    return phases_out


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{1000 * value:6.0f}"


def _cpu_ms(seconds: float, rows: int) -> str:
    return f"{1000 * seconds / max(1, rows):5.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run each rate and print achieved rate, lag p50/p99/max, backlog and CPU per message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    parser.add_argument("--seconds", type=float, default=20.0, help="per rate")
    parser.add_argument("--ranks", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2, help="sender processes")
    parser.add_argument("--drain-timeout-s", type=float, default=60.0)
    parser.add_argument("--sqs", choices=["moto", "localstack"], default="moto")
    parser.add_argument(
        "--warmup-s", type=float, default=5.0, help="unmeasured first seconds per rate (0: none)"
    )
    args = parser.parse_args(argv)
    print(
        f"end-to-end lag (report() -> commit), {args.ranks} ranks in {args.processes} processes,"
        f" open loop, {args.seconds:.0f} s per rate, writer concurrency 2, SQS {args.sqs};"
        f" load average {_load()} (other work on this machine shares the cores)",
        flush=True,
    )
    print(
        f"{'target/s':>8} {'achieved/s':>10} {'rows':>6} {'p50 ms':>6} {'p99 ms':>6} {'max ms':>6}"
        f" {'backlog max':>11} {'at end':>6} {'drained':>8} {'slip ms':>7}"
        "  CPU ms/msg: client source writer postgres emulator | load",
        flush=True,
    )
    phases: list[LagPhase] = []
    failed = False
    # Each rate gets its own pipeline (fresh emulator, queues, database): a rate that overloads
    # the local stand-ins must not take the other rate's figures down with it.
    for rate in args.rates:
        try:
            *warm, ph = run_lag(
                rates=[rate], seconds=args.seconds, ranks=args.ranks,
                processes=args.processes, drain_timeout_s=args.drain_timeout_s, sqs=args.sqs,
                warmup_s=args.warmup_s,
            )  # fmt: skip
        except Exception as exc:  # reported as a row: the rate could not be measured
            print(f"{rate:8.0f}  not measured: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            failed = True
            continue
        for w in warm:
            print(
                f"{'warm-up':>8} {w.achieved_rate:10.1f} {w.rows:6d} {_ms(w.p50_s)}"
                f" {_ms(w.p99_s)} {_ms(w.max_s)}   (first {w.seconds:.0f} s of a fresh pipeline,"
                " not measured)",
                flush=True,
            )
            if w.tail is not None:
                print(f"    {w.tail}", flush=True)
        phases.append(ph)
        drained = "never" if ph.drained_after_s is None else f"+{ph.drained_after_s:.1f} s"
        print(
            f"{ph.target_rate:8.0f} {ph.achieved_rate:10.1f} {ph.rows:6d} {_ms(ph.p50_s)}"
            f" {_ms(ph.p99_s)} {_ms(ph.max_s)} {ph.max_backlog:11d}"
            f" {'?' if ph.end_backlog is None else ph.end_backlog:>6}"
            f" {drained:>8} {1000 * ph.max_slip_s:7.0f}"
            f"              {_cpu_ms(ph.cpu_client_s, ph.rows)} {_cpu_ms(ph.cpu_source_s, ph.rows)}"
            f"  {_cpu_ms(ph.cpu_writer_s, ph.rows)}    {_cpu_ms(ph.cpu_postgres_s, ph.rows)}"
            f"    {_cpu_ms(ph.cpu_emulator_s, ph.rows)} |"
            f" {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if ph.tail is not None:
            print(f"    {ph.tail}", flush=True)
        if ph.sqs_unanswered:
            print(f"    SQS left {ph.sqs_unanswered} depth samples unanswered (overloaded)")
    held = [
        ph.target_rate
        for ph in phases
        if ph.p99_s is not None and ph.p99_s <= HELD_P99_S and ph.rows == ph.reported
        and ph.achieved_rate >= 0.95 * ph.target_rate and ph.drained_after_s is not None
    ]  # fmt: skip
    with sqs_emulator(args.sqs) as endpoint:
        ceiling, emu_cpu = _sqs.ceiling(endpoint, seconds=min(10.0, args.seconds))
    best = max(held, default=None)
    print(
        f"highest rate held (p99 <= {HELD_P99_S:.0f} s, achieved >= 95 %, drained):"
        f" {'none' if best is None else f'{best:.0f} msg/s'}; {args.sqs} bare ceiling (send +"
        f" receive + delete, no writer): {ceiling:.0f} msg/s, emulator {1000 * emu_cpu:.2f} ms"
        f" CPU/msg; held/ceiling {'n/a' if best is None else f'{best / ceiling:.2f}'};"
        f" load average {_load()}",
        flush=True,
    )
    lost = sum(ph.reported - ph.rows for ph in phases)  # warm-up rows are checked by their drain
    if lost:
        print(f"  {lost} reported rows not in the database")
    return 0 if lost == 0 and not failed else 1


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
