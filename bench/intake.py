"""Intake: N ranks x C checkpoints, every rank's own FIFO message beside packs per node.

Method and figures: BENCHMARKS.md §1, "The intake". Per N, per-rank FIFO then packed (one run
per ``--pack``), each into a fresh database on one emulator and one cluster; the ranks are
``bench._intake_senders``'; the event source is held while a barrier sends
(``bench._drains.DrainSwitch``), and "drain" runs from its release to the barrier's last row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _plot
from bench._drains import DrainSwitch, wait_for_rows
from bench._harness import cli, machine, parse, plotted, secs, verdict
from bench._intake_senders import SenderProcesses, SenderSetup, chunks, processes_for
from bench.fanin import GOAL_MAX_WRITER_CONNECTIONS, WRITER_ROLE, migrated_database
from ckpt_pipeline.demo.fanin import count_rows
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.embedded_pg import ThrowawayCluster, start_throwaway_cluster
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, local_pipeline
from ckpt_pipeline.local.sqs_server import sqs_emulator
from ckpt_pipeline.ops.sqs import queue_depth
from trainer_client.report.pack_relay import DEFAULT_MAX_REPORTS

GOAL_SPEEDUP = 3.0
WRITERS = 2


@dataclass
class IntakeRun:
    """One intake at one N: per barrier, the messages, the send and the drain."""

    ranks: int
    checkpoints: int
    pack: int  # 0: per-rank
    processes: int
    messages: list[int] = field(default_factory=list)  # SQS took, by the senders' count
    queued: list[int] = field(default_factory=list)  # the queue's depth when the drain began
    send_s: list[float] = field(default_factory=list)  # release -> every report acknowledged
    drain_s: list[float] = field(default_factory=list)  # switch opened -> every row in
    errors: Counter[str] = field(default_factory=Counter)
    resent: int = 0  # entries the ranks sent again
    rows: int = 0
    dlq: int = 0
    peak_writer: int = 0
    batches: int = 0
    redelivered: int = 0  # records the event source saw fail (they came back)
    sender_cpu_s: float = 0.0

    @property
    def expected(self) -> int:
        return self.ranks * self.checkpoints

    @property
    def drained(self) -> bool:
        return len(self.drain_s) == self.checkpoints

    @property
    def drain_total_s(self) -> float | None:
        return sum(self.drain_s) if self.drained else None

    @property
    def failures(self) -> int:
        return sum(self.errors.values()) + (self.expected - self.rows)

    @property
    def ok(self) -> bool:
        return (
            self.failures == 0
            and self.dlq == 0
            and self.drained
            and self.peak_writer <= GOAL_MAX_WRITER_CONNECTIONS
        )


def run_intake(
    cluster: ThrowawayCluster, endpoint: str, *, ranks: int, checkpoints: int, pack: int,
    processes: int, threads: int, spool_dir: Path, timeout_s: float,
) -> IntakeRun:  # fmt: skip
    """One intake at ``ranks``: ``checkpoints`` barriers, each sent, then drained."""
    db, writer_url = migrated_database(cluster, "intake", WRITER_ROLE)
    job = f"intake-{ranks}-{pack or 'rank'}"
    parts = chunks(ranks, processes_for(ranks, processes), pack)
    run = IntakeRun(ranks, checkpoints, pack, len(parts))
    switch = DrainSwitch(WRITERS)
    with (
        local_pipeline(db, endpoint_url=endpoint, writer_database_url=writer_url,
                       concurrency=WRITERS, start=False) as pipe,
        PeakConnections(db) as peak,
    ):  # fmt: skip
        pipe.source.gate = switch
        setup = SenderSetup(
            pipe.client_env(), pipe.queues.queue_url, job, ranks, str(spool_dir), pack, threads
        )
        with pipe.source, SenderProcesses(setup, parts, checkpoints) as senders:
            for c in range(checkpoints):
                switch.close()
                released = senders.release()
                sent, stopped = senders.sent(timeout_s)
                for error in stopped:
                    run.errors[error] += 1
                for s in sent:
                    run.errors.update(s.errors)
                    run.resent += s.retried
                    run.sender_cpu_s += s.cpu_s
                if stopped or len(sent) < len(parts):
                    break
                run.send_s.append(max(s.acked_at for s in sent) - released)
                run.messages.append(sum(s.messages for s in sent))
                run.queued.append(queue_depth(pipe.sqs, pipe.queues.queue_url).visible)
                opened = switch.open()
                done = wait_for_rows(
                    db, job, rows=ranks * (c + 1), complete=c + 1, deadline=opened + timeout_s
                )
                if done is None:
                    break
                run.drain_s.append(done - opened)
        run.rows, _ = count_rows(db, job)
        run.dlq, stats = pipe.dlq_depth(), pipe.source.stats
    run.peak_writer = peak.peak(WRITER_APPLICATION_NAME)
    run.batches, run.redelivered = stats.batches, stats.failed_records
    return run


@dataclass(frozen=True)
class IntakeRow:
    """One N: the per-rank run, then the packed ones, back to back."""

    per_rank: IntakeRun
    packed: list[IntakeRun]
    load: tuple[float, float, float]  # load averages when the row finished

    def speedup(self, packed: IntakeRun) -> float | None:
        a, b = self.per_rank.drain_total_s, packed.drain_total_s
        return None if a is None or b is None or b == 0 else a / b

    @property
    def ok(self) -> bool:
        return all(run.ok for run in (self.per_rank, *self.packed))

    def to_json(self) -> str:
        """One line of a ``--results`` file."""
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(line: str) -> IntakeRow:
        """A row written by :meth:`to_json` (an earlier run's, for the plot)."""
        raw = json.loads(line)

        def run(d: dict[str, Any]) -> IntakeRun:
            return IntakeRun(**{**d, "errors": Counter(d["errors"])})

        load = raw["load"]
        return IntakeRow(run(raw["per_rank"]), [run(d) for d in raw["packed"]],
                         (load[0], load[1], load[2]))  # fmt: skip


def read_results(path: Path) -> list[IntakeRow]:
    """The rows of a ``--results`` file, the latest at each N, by N."""
    if not path.exists():
        return []
    rows = [IntakeRow.from_json(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted({r.per_rank.ranks: r for r in rows}.values(), key=lambda r: r.per_rank.ranks)


HEADER = (
    f"{'N':>6} {'intake':16} {'msgs/barrier':>12} {'rows':>13} {'failed':>6} {'DLQ':>3}"
    f" {'writer conns':>12} {'batches':>7} {'send':>8} {'drain':>8} {'per barrier':>20}"
    f" {'speedup':>7}  load"
)


def print_row(row: IntakeRow) -> None:
    for run in (row.per_rank, *row.packed):
        name = f"packed per {run.pack}" if run.pack else "per-rank FIFO"
        speedup = row.speedup(run) if run.pack else None
        msgs = "/".join(str(m) for m in run.messages) or "-"
        each = "/".join(f"{d:.1f}" for d in run.drain_s) or "-"
        print(
            f"{run.ranks:6d} {name:16} {msgs:>12} {run.rows:6d}/{run.expected:<6d}"
            f" {run.failures:6d} {run.dlq:3d} {run.peak_writer:12d} {run.batches:7d}"
            f" {secs(sum(run.send_s)):>8} {secs(run.drain_total_s):>8} {each:>20}"
            f" {'' if speedup is None else f'{speedup:.1f}x':>7}"
            f"  {' '.join(f'{x:.1f}' for x in row.load)}"
            f"{'' if run.ok else '  GOAL MISSED'}"
        )
        queued = "" if run.queued == run.messages else f"; queue depth {run.queued}"
        print(
            f"{'':6} {'':16} {run.processes} sender processes, {run.sender_cpu_s:.1f} s of their"
            f" CPU; {run.resent} entries resent; {run.redelivered} records redelivered{queued}"
        )
        for kind, count in run.errors.most_common(3):
            print(f"        x{count}: {kind}")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    p = cli(__doc__, plot="intake.png: drain vs ranks, both intakes", sqs="localstack")
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--checkpoints", type=int, default=3)
    p.add_argument("--pack", type=int, nargs="+", default=[DEFAULT_MAX_REPORTS],
                   help="reports per pack, one packed run each (default: the relay's)")  # fmt: skip
    p.add_argument("--processes", type=int, default=4,
                   help="sender processes (more if their spools need more open files)")  # fmt: skip
    p.add_argument("--threads", type=int, default=16, help="workers per sender process")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per send and per drain")
    p.add_argument(
        "--results", type=Path, default=None, metavar="FILE",
        help="append each N's row to FILE (JSON lines); --plot then draws every N in FILE, so"
        " that a sweep split over runs gives one figure",
    )  # fmt: skip
    return p


def run(args: argparse.Namespace) -> list[IntakeRow]:
    """Both intakes at every N in one cluster and emulator, each pair printed as it finishes."""
    print(
        f"intake: {args.checkpoints} checkpoint barriers, each sent with the event source held,"
        f" then drained; writer concurrency {WRITERS}, FIFO event source batches <= 10; packs of"
        f" {' and '.join(map(str, args.pack))}; {args.processes} sender processes x"
        f" {args.threads} workers; SQS {args.sqs}; {machine()}",
        flush=True,
    )
    print(HEADER, flush=True)
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-intake-") as tmp,
        start_throwaway_cluster(max_connections=30) as cluster,
        sqs_emulator(args.sqs) as endpoint,
    ):
        for n in args.ranks:
            runs = []
            for pack in (0, *args.pack):
                spool = Path(tmp) / f"spool-{n}-{pack}"
                spool.mkdir()
                run_ = run_intake(
                    cluster, endpoint, ranks=n, checkpoints=args.checkpoints, pack=pack,
                    processes=args.processes, threads=args.threads, spool_dir=spool,
                    timeout_s=args.timeout_s,
                )  # fmt: skip
                runs.append(run_)
            rows.append(IntakeRow(runs[0], runs[1:], os.getloadavg()))
            print_row(rows[-1])
            if args.results is not None:
                with args.results.open("a") as f:
                    f.write(rows[-1].to_json() + "\n")
    return rows


def plot_intake(rows: Sequence[IntakeRow], path: Path) -> Path:
    """Seconds to drain the barriers' reports vs ranks: every rank's own FIFO message beside
    reports packed per node, measured back to back."""
    first = rows[0].per_rank
    fig, (ax,) = _plot.figure(
        f"Intake: {first.checkpoints} barriers of N ranks drained by {WRITERS} writers,"
        " LocalStack, measured here"
    )
    ns = [r.per_rank.ranks for r in rows]
    lines = [("per-rank FIFO messages", [r.per_rank for r in rows], "o-", _plot.DIRECT)]
    styles = [("s-", _plot.PIPELINE), ("^-", "tab:green"), ("v-", "tab:purple")]
    for i, run in enumerate(rows[0].packed):
        style, colour = styles[i % len(styles)]
        lines.append((f"packed, <= {run.pack} reports per message", [r.packed[i] for r in rows],
                      style, colour))  # fmt: skip
    for label, runs, style, colour in lines:
        done = [(run.ranks, run.drain_total_s) for run in runs if run.drain_total_s is not None]
        if done:  # a run that never had every row in is left out
            ax.plot(*zip(*done, strict=True), style, color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("ranks")
    ax.set_ylabel("seconds from reports in the queue to every row in")
    ax.legend(fontsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both intakes at every N; 1 if the goal is missed."""
    p = parser()
    args = parse(p, argv)
    if min(args.pack) < 2 or args.checkpoints < 1 or min(args.ranks) < 1:
        p.error("--pack must be at least 2, --checkpoints and --ranks at least 1")
    if args.processes < 1 or args.threads < 1:
        p.error("--processes and --threads must be at least 1")
    started = time.monotonic()
    rows = run(args)
    if args.plot is not None:
        drawn = read_results(args.results) if args.results is not None else rows
        plotted(plot_intake(drawn, args.plot / "intake.png"))
    largest = max(rows, key=lambda r: r.per_rank.ranks)
    speedups = [largest.speedup(run) for run in largest.packed]
    fast = all(s is not None and s >= GOAL_SPEEDUP for s in speedups)
    met = all(r.ok for r in rows) and fast
    print(
        f"goal (every row in once, 0 failures, DLQ 0, <= {GOAL_MAX_WRITER_CONNECTIONS} writer"
        f" connections; packed >= {GOAL_SPEEDUP:g}x faster at N={largest.per_rank.ranks}):"
        f" {verdict(met)}; {time.monotonic() - started:.0f} s in all",
        flush=True,
    )
    return 0 if met else 1
