"""Intake: N ranks x C checkpoints, every rank's own FIFO message beside reports packed per node,
back to back on one SQS emulator and one database cluster.

Run: ``python -m bench intake [--ranks 1024 4096 16384] [--checkpoints 3] [--pack 8]
[--sqs localstack|moto] [--plot DIR]``.

For every N, both intakes run through the whole local pipeline of ``bench.fanin`` (real
reporters with their spools and senders in rank processes, the emulator, the real writer at
concurrency 2 driven by the local FIFO event source: batches of at most 10 messages, no window,
as Lambda's), each into a fresh database, per-rank first, then packed:

* per-rank FIFO: every rank's sender sends its own report (the default);
* packed per node: the ranks of a rank process send through one pack relay
  (``trainer_client.pack_relay.PackRelay``) that packs up to ``--pack`` reports per message, as a
  node leader packs its node's ranks; the writer expands the packs.

"drain" is from the first barrier's release to every row (and every complete checkpoint) in the
database; the goal: every row in once, 0 failures, at most 2 writer connections, and packed at
least 3x faster than per-rank at the largest N.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import _plot
from bench.fanin import GOAL_MAX_WRITER_CONNECTIONS, PipelineRun, run_pipeline
from ckpt_pipeline.local.embedded_pg import start_throwaway_cluster
from ckpt_pipeline.local.sqs_server import sqs_emulator

GOAL_SPEEDUP = 3.0


@dataclass(frozen=True)
class IntakeRow:
    """One N: the per-rank and the packed run, back to back."""

    per_rank: PipelineRun
    packed: PipelineRun
    pack: int
    load: float  # 1-minute load average when the pair finished

    @property
    def speedup(self) -> float | None:
        a, b = self.per_rank.all_rows_s, self.packed.all_rows_s
        return None if a is None or b is None else a / b

    @staticmethod
    def ok(run: PipelineRun) -> bool:
        return (
            run.failures == 0
            and run.dlq == 0
            and run.all_rows_s is not None
            and run.peak_writer <= GOAL_MAX_WRITER_CONNECTIONS
        )


HEADER = (
    f"{'N':>6} {'intake':20} {'written':>13} {'failed':>6} {'writer conns':>12} {'batches':>8}"
    f" {'drain':>9} {'speedup':>8}  load"
)


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def print_row(row: IntakeRow) -> None:
    for name, run in (("per-rank FIFO", row.per_rank), (f"packed per {row.pack}", row.packed)):
        speedup = row.speedup if run is row.packed else None
        print(
            f"{run.ranks:6d} {name:20} {run.rows:6d}/{run.expected:<6d} {run.failures:6d}"
            f" {run.peak_writer:12d} {run.batches:8d} {_secs(run.all_rows_s):>9}"
            f" {'' if speedup is None else f'{speedup:.1f}x':>8}  {row.load:.2f}"
            f"{'' if IntakeRow.ok(run) else '  GOAL MISSED'}"
        )
        for kind, count in run.errors.most_common(3):
            print(f"        x{count}: {kind}")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--checkpoints", type=int, default=3)
    p.add_argument("--pack", type=int, default=8, help="reports per pack (a node's ranks)")
    p.add_argument("--sqs", choices=["moto", "localstack"], default="localstack")
    p.add_argument("--timeout-s", type=float, default=1200.0, help="per pipeline run")
    p.add_argument(
        "--ranks-per-process", type=int, default=None,
        help="simulated ranks per process (default: N / cores, i.e. one process per core)",
    )  # fmt: skip
    p.add_argument(
        "--plot", type=Path, default=None, metavar="DIR",
        help="also draw DIR/intake.png: drain vs ranks, both intakes (needs matplotlib)",
    )  # fmt: skip
    return p


def run(args: argparse.Namespace) -> list[IntakeRow]:
    """Both intakes at every N in one cluster and emulator, each pair printed as it finishes."""
    print(
        f"intake: {args.checkpoints} checkpoints at a barrier, writer concurrency 2, FIFO event"
        f" source batches <= 10; packs of <= {args.pack}; SQS {args.sqs}; {os.cpu_count()} CPUs,"
        f" load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
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
            for pack in (0, args.pack):
                spool = Path(tmp) / f"spool-{n}-{pack}"
                spool.mkdir()
                per_process = args.ranks_per_process or -(-n // (os.cpu_count() or 1))
                run_ = run_pipeline(
                    cluster, endpoint, ranks=n, checkpoints=args.checkpoints,
                    ranks_per_process=per_process, spool_dir=spool, timeout_s=args.timeout_s,
                    read_timeout_s=30.0, switch_interval_s=0.05, pack_reports=pack,
                )  # fmt: skip
                runs.append(run_)
            rows.append(IntakeRow(runs[0], runs[1], args.pack, os.getloadavg()[0]))
            print_row(rows[-1])
    return rows


def plot_intake(rows: Sequence[IntakeRow], path: Path) -> Path:
    """Seconds from the first barrier to every row in vs ranks: every rank's own FIFO message
    beside reports packed per node, measured back to back."""
    fig, (ax,) = _plot.figure(
        f"Intake: {rows[0].per_rank.checkpoints} checkpoints of N ranks, 2 writers, measured here"
    )
    ns = [r.per_rank.ranks for r in rows]
    for label, runs, style, colour in (
        ("per-rank FIFO messages", [r.per_rank for r in rows], "o-", _plot.DIRECT),
        (
            f"packed per node ({rows[0].pack} reports)",
            [r.packed for r in rows],
            "s-",
            _plot.PIPELINE,
        ),
    ):
        done = [(run.ranks, run.all_rows_s) for run in runs if run.all_rows_s is not None]
        if done:  # a run that never had every row in is left out
            ax.plot(*zip(*done, strict=True), style, color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("ranks")
    ax.set_ylabel("seconds from the first barrier to every row in")
    ax.legend(fontsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both intakes at every N; 1 if the goal is missed."""
    p = parser()
    args = p.parse_args(argv)
    if args.pack < 2 or args.checkpoints < 1 or min(args.ranks) < 1:
        p.error("--pack must be at least 2, --checkpoints and --ranks at least 1")
    if args.plot is not None:
        _plot.require()
    rows = run(args)
    if args.plot is not None:
        print(f"plot: {plot_intake(rows, args.plot / 'intake.png')}", flush=True)
    largest = rows[-1]
    fast = largest.speedup is not None and largest.speedup >= GOAL_SPEEDUP
    met = all(IntakeRow.ok(r.per_rank) and IntakeRow.ok(r.packed) for r in rows) and fast
    print(
        f"goal (every row in once, 0 failures, <= {GOAL_MAX_WRITER_CONNECTIONS} writer"
        f" connections; packed >= {GOAL_SPEEDUP:g}x faster at N={largest.packed.ranks}):"
        f" {'met' if met else 'MISSED'}",
        flush=True,
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
