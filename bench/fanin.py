"""Fan-in: N ranks x 5 checkpoints, the pipeline beside the seed's direct-write design.

Method and figures: BENCHMARKS.md §1. One throwaway cluster capped as the seed's RDS (30
connections), a database per design and N; the ranks are ``bench._ranks``' threads in spawned
processes, the direct write ``ckpt_pipeline.demo.direct_write``. Beside them the machine's CPU
split between the parts (``bench._cpu.CpuSplit``) and the emulator's own floor (``bench._sqs``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import _plot, _sqs
from bench._cpu import CpuSplit, PartsCpu, WriterCpu
from bench._drains import wait_for_rows
from bench._harness import cli, load, parse, plotted, role_database, secs, verdict
from bench._ranks import RankProcesses, RankSetup, fanin_worker, split
from bench._reports import report
from ckpt_pipeline.demo.direct_write import APPLICATION_NAME, DirectWriteResult, run_direct_write
from ckpt_pipeline.demo.fanin import count_rows, fanin_step, fanin_uri
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.embedded_pg import ThrowawayCluster, start_throwaway_cluster
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, local_pipeline
from ckpt_pipeline.local.sqs_server import sqs_emulator

SEED_MAX_CONNECTIONS = 30
SEED_STATEMENT_TIMEOUT = "5s"
SEED_POOL_SIZE = 5
APP_ROLE = "seed_app"
WRITER_ROLE = "ckpt_writer"
DEFAULT_RANKS = (64, 256, 1024)
GOAL_MAX_WRITER_CONNECTIONS = 2


@dataclass(frozen=True)
class PipelineRun:
    """One pipeline fan-in: what was reported, what reached the database, and when."""

    ranks: int
    checkpoints: int
    processes: int
    ready_s: float
    errors: Counter[str]
    unflushed_ranks: int
    rows: int
    all_rows_s: float | None
    after_last_barrier_s: float | None
    all_acked_s: float
    peak_writer: int
    dlq: int
    retried_records: int
    batches: int
    cpu: CpuSplit  # from the first barrier until every row is in (or the timeout)
    build_cpu_ms_per_rank: float
    build_mb_per_rank: float

    @property
    def expected(self) -> int:
        return self.ranks * self.checkpoints

    @property
    def failures(self) -> int:
        return sum(self.errors.values()) + (self.expected - self.rows)


@dataclass(frozen=True)
class FaninRow:
    """One N: the pipeline, the emulator's floor for the same messages, the direct write."""

    pipeline: PipelineRun
    floor_s: float
    floor_cpu_s: float
    direct: DirectWriteResult | None
    direct_rows: int = 0
    direct_peak: int = 0

    @property
    def goal_met(self) -> bool:
        p = self.pipeline
        return p.failures == 0 and p.dlq == 0 and p.peak_writer <= GOAL_MAX_WRITER_CONNECTIONS


def migrated_database(cluster: ThrowawayCluster, prefix: str, role: str) -> tuple[str, str]:
    """A migrated database and ``role``'s URL for it, with the seed's statement_timeout."""
    return role_database(cluster, prefix, role, SEED_STATEMENT_TIMEOUT)


def run_pipeline(
    cluster: ThrowawayCluster, endpoint: str, *, ranks: int, checkpoints: int,
    ranks_per_process: int, spool_dir: Path, timeout_s: float, read_timeout_s: float = 5.0,
    switch_interval_s: float | None = None,
) -> PipelineRun:  # fmt: skip
    """Fan ``ranks`` reporters in through the whole local pipeline; wait for every row."""
    db, writer_url = migrated_database(cluster, "pipe", WRITER_ROLE)
    job = f"fanin-{ranks}"
    writer_cpu = WriterCpu()
    with (
        local_pipeline(
            db, endpoint_url=endpoint, writer_database_url=writer_url, on_done=writer_cpu.add
        ) as pipe,
        PeakConnections(db) as peak,
    ):
        chunks = split(ranks, ranks_per_process)
        setup = RankSetup(
            pipe.client_env(), pipe.queues.queue_url, job, ranks, str(spool_dir),
            read_timeout_s=read_timeout_s, switch_interval_s=switch_interval_s,
        )  # fmt: skip
        parts = PartsCpu(endpoint, cluster.data_dir, lambda: writer_cpu.seconds)
        with RankProcesses(
            fanin_worker, setup, chunks, checkpoints, flush_timeout_s=timeout_s
        ) as procs:
            first = last = procs.release()
            before = parts.read()  # after the release: the reporters' build is not the fan-in's
            broken = False
            try:
                for _ in range(checkpoints - 1):
                    last = procs.release()
            except threading.BrokenBarrierError:
                broken = True  # a rank failed: its error comes back with the results
            all_rows_at = wait_for_rows(
                db, job, rows=ranks * checkpoints, complete=checkpoints,
                deadline=first + (0.0 if broken else timeout_s),
            )  # fmt: skip
            after = parts.read()
            workers = procs.results(60.0 if broken else timeout_s)
        rows, _ = count_rows(db, job)
        stats, dlq = pipe.source.stats, pipe.dlq_depth()
    errors: Counter[str] = Counter()
    for w in workers:
        errors.update(w.errors)
    if len(chunks) > len(workers):
        errors[f"worker process gave no result x{len(chunks) - len(workers)}"] += 1
    return PipelineRun(
        ranks=ranks,
        checkpoints=checkpoints,
        processes=len(chunks),
        ready_s=max((w.ready_s for w in workers), default=0.0),
        errors=errors,
        unflushed_ranks=sum(w.unflushed_ranks for w in workers),
        rows=rows,
        all_rows_s=None if all_rows_at is None else all_rows_at - first,
        after_last_barrier_s=None if all_rows_at is None else all_rows_at - last,
        all_acked_s=max((w.flushed_at for w in workers), default=first) - first,
        peak_writer=peak.peak(WRITER_APPLICATION_NAME),
        dlq=dlq,
        retried_records=stats.failed_records,
        batches=stats.batches,
        build_cpu_ms_per_rank=1000 * sum(w.build_cpu_s for w in workers) / ranks,
        build_mb_per_rank=sum(w.build_rss_mb for w in workers) / ranks,
        # The rank processes' CPU after their reporters were built: barriers, reports, sends
        # and the final flush (it ends with the last acknowledgement, at most a poll interval
        # after the last row is in).
        cpu=PartsCpu.split(before, after, sum(w.cpu_s - w.build_cpu_s for w in workers)),
    )


def run_fanin(
    cluster: ThrowawayCluster, endpoint: str, n: int, args: argparse.Namespace, spool: Path
) -> FaninRow:
    """One N: the pipeline, then the emulator's floor, then (unless ``--no-direct``) the
    direct write."""
    pipe = run_pipeline(
        cluster, endpoint, ranks=n, checkpoints=args.checkpoints,
        ranks_per_process=args.ranks_per_process or -(-n // (os.cpu_count() or 1)),
        spool_dir=spool, timeout_s=args.timeout_s, read_timeout_s=args.client_read_timeout_s,
        switch_interval_s=args.switch_interval_ms / 1000,
    )  # fmt: skip
    reports = [
        report(f"floor-{n}", fanin_step(c), r, n, epoch=c, uri=fanin_uri(fanin_step(c), r))
        for c in range(args.checkpoints)
        for r in range(n)
    ]
    floor_s, floor_cpu_s = _sqs.floor(endpoint, reports)
    if args.no_direct:
        return FaninRow(pipe, floor_s, floor_cpu_s, None)
    db, app_url = migrated_database(cluster, "seed", APP_ROLE)
    with PeakConnections(db) as peak:
        direct = run_direct_write(
            app_url, job_id=f"seed-{n}", ranks=n, checkpoints=args.checkpoints,
            pool_size=SEED_POOL_SIZE,
        )  # fmt: skip
    rows, _ = count_rows(db, f"seed-{n}")
    return FaninRow(pipe, floor_s, floor_cpu_s, direct, rows, peak.peak(APPLICATION_NAME))


HEADER = (
    f"{'N':>5} {'design':14} {'written':>11} {'failed':>7} {'peak conn':>9} "
    f"{'all rows in DB':>15}  notes"
)


def print_row(row: FaninRow) -> None:
    r, c, n = row.pipeline, row.pipeline.cpu, row.pipeline.ranks
    print(
        f"{n:5d} {'pipeline':14} {r.rows:5d}/{r.expected:<5d} {r.failures:7d} "
        f"{r.peak_writer:>3d} writer {secs(r.all_rows_s):>15}  {r.processes} proc, reporters"
        f" built in {r.ready_s:.1f} s; all sent+acked by SQS at {r.all_acked_s:.1f} s; last"
        f" barrier -> all rows {secs(r.after_last_barrier_s)}; {r.batches} batches,"
        f" {r.retried_records} records retried, DLQ {r.dlq}; reporter build"
        f" {r.build_cpu_ms_per_rank:.1f} ms CPU, {r.build_mb_per_rank:.2f} MB per rank"
        + (f", {r.unflushed_ranks} ranks unflushed" if r.unflushed_ranks else "")
    )
    cores, rows = os.cpu_count() or 1, max(r.rows, 1)
    parts = (
        ("ranks", c.ranks_s), ("event source", c.source_s), ("writer", c.writer_s),
        ("postgres", c.postgres_s), ("emulator", c.emulator_s),
    )  # fmt: skip
    split_text = ", ".join(f"{name} {s:.1f} s ({1000 * s / rows:.2f})" for name, s in parts)
    print(
        f"{n:5d} {'pipeline CPU':14} {c.wall_s:.1f} s on {cores} cores, busy"
        f" {100 * c.busy_share(cores):.0f} %, steal {100 * c.steal_s / (cores * c.wall_s):.0f} %;"
        f" CPU s (ms per row): {split_text}"
    )
    for kind, count in r.errors.most_common(4):
        print(f"        x{count}: {kind}")
    ratio = "n/a" if r.all_rows_s is None else f"{r.all_rows_s / row.floor_s:.1f}x"
    print(
        f"{n:5d} {'SQS floor':14} bare client send+receive+delete of the same {r.expected}"
        f" messages: {row.floor_s:.1f} s, emulator CPU {row.floor_cpu_s:.1f} s"
        f" ({1000 * row.floor_cpu_s / r.expected:.2f} ms per message); pipeline/floor {ratio};"
        f" load average {load()}"
    )
    if (d := row.direct) is not None:
        when = "never" if row.direct_rows < d.attempted else f"{d.elapsed_s:.1f} s"
        print(
            f"{n:5d} {'direct write':14} {row.direct_rows:5d}/{d.attempted:<5d} {d.failed:7d} "
            f"{row.direct_peak:>9d} {when:>15}  ran {d.elapsed_s:.1f} s, wanted"
            f" {d.ranks * SEED_POOL_SIZE} connections"
        )
        for kind, count in d.errors.most_common(4):
            print(f"        x{count}: {kind}")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    p = cli(__doc__, plot="fanin.png", sqs="moto")
    p.add_argument("--ranks", type=int, nargs="+", default=list(DEFAULT_RANKS))
    p.add_argument("--checkpoints", type=int, default=5)
    p.add_argument("--no-direct", action="store_true", help="skip the direct-write rows")
    p.add_argument(
        "--ranks-per-process", type=int, default=None,
        help="simulated ranks per process (default: N / cores, i.e. one process per core)",
    )  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=300.0, help="per pipeline run")
    p.add_argument(
        "--client-read-timeout-s", type=float, default=5.0,
        help="reporters' SQS read timeout (default the client's 5 s); moto slows with queue"
        " depth, and at N >= 256 a 5 s timeout turns its slowness into a resend storm",
    )  # fmt: skip
    p.add_argument(
        "--switch-interval-ms", type=float, default=50.0,
        help="sys.setswitchinterval of the rank processes (default 50; CPython's own is 5):"
        " hundreds of simulated ranks share one GIL there, which no real rank does",
    )  # fmt: skip
    return p


def run(args: argparse.Namespace) -> list[FaninRow]:
    """Every N of ``args.ranks`` in one cluster and emulator, each row printed as it finishes."""
    print(
        f"fan-in: {args.checkpoints} checkpoints at a barrier; PostgreSQL max_connections"
        f" {SEED_MAX_CONNECTIONS}, statement_timeout {SEED_STATEMENT_TIMEOUT} (roles"
        f" {WRITER_ROLE}, {APP_ROLE}); pipeline writer concurrency 2; direct write pool"
        f" {SEED_POOL_SIZE}/rank; ranks per process <= {args.ranks_per_process or 'N / cores'},"
        f" their GIL switch interval {args.switch_interval_ms:g} ms; SQS {args.sqs};"
        f" load average {load()}",
        flush=True,
    )
    print(HEADER, flush=True)
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-fanin-") as tmp,
        start_throwaway_cluster(max_connections=SEED_MAX_CONNECTIONS) as cluster,
        sqs_emulator(args.sqs) as endpoint,
    ):
        for n in args.ranks:
            spool = Path(tmp) / f"spool-{n}"
            spool.mkdir()
            rows.append(run_fanin(cluster, endpoint, n, args, spool))
            print_row(rows[-1])
    return rows


def plot_fanin(rows: Sequence[FaninRow], path: Path) -> Path:
    """Left: seconds until every row is in vs ranks, the pipeline beside the SQS emulator's own
    floor for the same messages (and the direct write where it got every row in). Right: the
    share of the rows each design got into the database."""
    fig, (time_ax, rows_ax) = _plot.figure(
        "Fan-in: N ranks reporting at each checkpoint barrier", 2
    )
    ns = [r.pipeline.ranks for r in rows]
    done = [(r.pipeline.ranks, r.pipeline.all_rows_s) for r in rows if r.pipeline.all_rows_s]
    if done:  # a run that never had every row in is left out (its row says "never")
        time_ax.plot(*zip(*done, strict=True), "o-", color=_plot.PIPELINE, label="pipeline")
    time_ax.plot(ns, [r.floor_s for r in rows], "s--", color=_plot.FLOOR,
                 label="SQS emulator alone,\nsame messages (floor)")  # fmt: skip
    rows_ax.plot(ns, [100 * r.pipeline.rows / r.pipeline.expected for r in rows], "o-",
                 color=_plot.PIPELINE, label="pipeline")  # fmt: skip
    direct = [(r.pipeline.ranks, r.direct, r.direct_rows) for r in rows if r.direct is not None]
    if direct:
        whole = [(n, d.elapsed_s) for n, d, got in direct if got == d.attempted]
        if whole:
            label = "direct write (seed),\nwhere every row got in"
            time_ax.plot(*zip(*whole, strict=True), "x-", color=_plot.DIRECT, label=label)
        rows_ax.plot([n for n, _, _ in direct], [100 * got / d.attempted for _, d, got in direct],
                     "x-", color=_plot.DIRECT, label="direct write (seed)")  # fmt: skip
    time_ax.set_ylabel("seconds from the first barrier to every row in")
    rows_ax.set_ylabel("rows in the database (%)")
    rows_ax.set_ylim(0, 105)
    for ax in (time_ax, rows_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("ranks")
        ax.legend(fontsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both designs at every N; 1 if the goal is missed."""
    p = parser()
    args = parse(p, argv)
    if args.ranks_per_process is not None and args.ranks_per_process < 1:
        p.error(f"--ranks-per-process must be at least 1, got {args.ranks_per_process}")
    if not args.switch_interval_ms > 0:
        p.error(f"--switch-interval-ms must be above 0, got {args.switch_interval_ms:g}")
    rows = run(args)
    if args.plot is not None:
        plotted(plot_fanin(rows, args.plot / "fanin.png"))
    met = all(r.goal_met for r in rows)
    print(
        f"goal (pipeline 0 failures, <= {GOAL_MAX_WRITER_CONNECTIONS} writer connections at"
        f" every N): {verdict(met)}",
        flush=True,
    )
    return 0 if met else 1
