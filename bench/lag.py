"""End-to-end lag at a steady rate: report() call -> shard row committed, through the pipeline.

Method and figures: BENCHMARKS.md §4. Each rate gets a fresh pipeline and ``--warmup-s``
unmeasured (printed as its own row); lag = ``pg_xact_commit_timestamp(xmin)`` - ``reported_at``,
one machine's clock; the senders are open loop. Then the emulator's bare ceiling
(``bench._sqs.ceiling``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from botocore.exceptions import BotoCoreError, ClientError

from bench import _plot, _sqs
from bench._cpu import CpuSplit, PartsCpu, WriterCpu
from bench._harness import cli, load, parse, plotted
from bench._ranks import RankProcesses, RankSetup, paced_worker, split
from ckpt_pipeline.local.embedded_pg import start_throwaway_cluster
from ckpt_pipeline.local.pipeline import LocalPipeline, local_pipeline
from ckpt_pipeline.local.sqs_server import SqsKind, sqs_emulator

JOB = "lag"
DEFAULT_RATES = (25.0, 50.0, 100.0, 200.0, 300.0, 500.0)
HELD_P99_S = 1.0
STEP_STRIDE = 1_000_000  # phase p uses steps p*STRIDE + k

# Per row of one phase: its reported and committed times (epoch seconds).
ROWS_SQL = """
SELECT extract(epoch FROM reported_at)::float8,
       extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8
FROM training_checkpoint_shards WHERE job_id = %s AND step >= %s AND step < %s
"""


@dataclass(frozen=True)
class LagPhase:
    """One rate's figures."""

    target_rate: float
    seconds: float
    reported: int
    max_slip_s: float
    lags_s: list[float]  # every row's lag, sorted
    max_backlog: int
    end_backlog: int | None
    sqs_unanswered: int
    drained_after_s: float | None
    cpu: CpuSplit  # from the release to the drain (ranks_s: the rank processes' own)
    warmup: bool = False  # the fresh pipeline's first seconds, not measured

    @property
    def rows(self) -> int:
        return len(self.lags_s)

    def pct(self, q: float) -> float | None:
        """The ``q`` quantile of the lags, interpolated as PostgreSQL's percentile_cont."""
        if not self.lags_s:
            return None
        pos = q * (len(self.lags_s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(self.lags_s) - 1)
        return self.lags_s[lo] + (self.lags_s[hi] - self.lags_s[lo]) * (pos - lo)

    @property
    def achieved_rate(self) -> float:
        return self.reported / self.seconds

    @property
    def held(self) -> bool:
        p99 = self.pct(0.99)
        return (
            p99 is not None and p99 <= HELD_P99_S and self.rows == self.reported
            and self.achieved_rate >= 0.95 * self.target_rate and self.drained_after_s is not None
        )  # fmt: skip


def _depth(pipe: LocalPipeline) -> int | None:
    """Queue depth, or None when the emulator does not answer (it stalls under overload)."""
    try:
        return pipe.depth()
    except (BotoCoreError, ClientError):
        return None


def _sample_backlog(pipe: LocalPipeline, until: float) -> tuple[int, int]:
    """(max depth, unanswered samples), sampling every 0.5 s until ``until`` (monotonic)."""
    deepest = unanswered = 0
    while time.monotonic() < until:
        time.sleep(min(0.5, max(0.0, until - time.monotonic())))
        depth = _depth(pipe)
        unanswered += depth is None
        deepest = max(deepest, depth or 0)
    return deepest, unanswered


def run_rate(
    rate: float, *, seconds: float, ranks: int, processes: int, drain_timeout_s: float,
    sqs: SqsKind = "moto", warmup_s: float = 0.0,
) -> list[LagPhase]:  # fmt: skip
    """``rate`` for ``seconds`` (after ``warmup_s`` of it, its own row) on a fresh pipeline,
    waiting after each phase until its rows are in; one row of figures per phase."""
    plan = ([(rate, warmup_s)] if warmup_s > 0 else []) + [(rate, seconds)]
    phases = [(r, secs, p * STEP_STRIDE) for p, (r, secs) in enumerate(plan)]
    out: list[LagPhase] = []
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-lag-") as spool,
        start_throwaway_cluster(settings={"track_commit_timestamp": "on"}) as cluster,
        sqs_emulator(sqs) as endpoint,
    ):
        db = cluster.create_database("lag")
        writer_cpu = WriterCpu()
        with local_pipeline(db, endpoint_url=endpoint, on_done=writer_cpu.add) as pipe:
            setup = RankSetup(pipe.client_env(), pipe.queues.queue_url, JOB, ranks, spool)
            chunks = split(ranks, -(-ranks // processes))
            parts = PartsCpu(endpoint, cluster.data_dir, lambda: writer_cpu.seconds)
            measured = []
            with RankProcesses(paced_worker, setup, chunks, phases, flush_timeout_s=120) as procs:
                for _, secs, _ in phases:
                    before = parts.read()
                    procs.release()
                    # The phase runs on the workers' schedule, half a second after the release.
                    backlog = _sample_backlog(pipe, time.monotonic() + secs + 0.5)
                    end_backlog, finished, drained = _depth(pipe), time.monotonic(), None
                    while time.monotonic() - finished < drain_timeout_s:
                        if _depth(pipe) == 0:
                            drained = time.monotonic() - finished
                            break
                        time.sleep(0.2)
                    measured.append((before, parts.read(), backlog, end_backlog, drained))
                workers = procs.results(120)
            errors = [e for w in workers for e in w.errors]
            if errors or len(workers) < len(chunks):
                print(f"  sender errors: {errors[:3]}, workers reporting: {len(workers)}")
            with psycopg.connect(db) as conn:
                for p, (r, secs, first_step) in enumerate(phases):
                    rows = conn.execute(ROWS_SQL, (JOB, first_step, first_step + STEP_STRIDE))
                    rows_p = [row for row in rows.fetchall() if row[1] is not None]
                    before, after, (deepest, unanswered), end_backlog, drained = measured[p]
                    client_s = sum(w.phase_cpu_s[p] for w in workers if p < len(w.phase_cpu_s))
                    out.append(LagPhase(
                        target_rate=r, seconds=secs,
                        reported=sum(w.phase_reported[p] for w in workers),
                        max_slip_s=max((w.phase_max_slip_s[p] for w in workers), default=0.0),
                        lags_s=sorted(c - rep for rep, c in rows_p),
                        max_backlog=deepest, end_backlog=end_backlog, sqs_unanswered=unanswered,
                        drained_after_s=drained, cpu=PartsCpu.split(before, after, client_s),
                        warmup=warmup_s > 0 and p == 0,
                    ))  # fmt: skip
    return out


def _ms(value: float | None) -> str:
    return "   n/a" if value is None else f"{1000 * value:6.0f}"


def print_phase(ph: LagPhase) -> None:
    head = f"{ph.achieved_rate:10.1f} {ph.rows:6d} {_ms(ph.pct(0.5))} {_ms(ph.pct(0.99))}"
    head += f" {_ms(ph.lags_s[-1] if ph.lags_s else None)}"
    if ph.warmup:
        print(
            f"{'warm-up':>8} {head}   (first {ph.seconds:.0f} s of a fresh pipeline, not measured)"
        )
    else:
        c, per = ph.cpu, 1000 / max(1, ph.rows)
        drained = "never" if ph.drained_after_s is None else f"+{ph.drained_after_s:.1f} s"
        print(
            f"{ph.target_rate:8.0f} {head} {ph.max_backlog:11d}"
            f" {'?' if ph.end_backlog is None else ph.end_backlog:>6} {drained:>8}"
            f" {1000 * ph.max_slip_s:7.0f}              {per * c.ranks_s:5.2f}"
            f" {per * c.source_s:5.2f}  {per * c.writer_s:5.2f}    {per * c.postgres_s:5.2f}"
            f"    {per * c.emulator_s:5.2f} |"
            f" {os.getloadavg()[0]:.2f}"
        )
    if ph.sqs_unanswered:
        print(f"    SQS left {ph.sqs_unanswered} depth samples unanswered (overloaded)")
    sys.stdout.flush()


@dataclass(frozen=True)
class LagCurve:
    """Every measured rate, and the emulator's bare ceiling."""

    phases: list[LagPhase]
    ceiling_per_s: float
    ceiling_cpu_s: float
    emulator: str  # moto or localstack
    ranks: int

    @property
    def held(self) -> float | None:
        return max((ph.target_rate for ph in self.phases if ph.held), default=None)


def plot_lag(curve: LagCurve, path: Path) -> Path:
    """Lag p50 and p99 vs offered rate, the p99 goal, and the emulator's bare ceiling."""

    fig, (ax,) = _plot.figure(
        f"End-to-end lag, report() to commit: {curve.ranks} ranks, open loop, {curve.emulator}"
    )
    phases = sorted(curve.phases, key=lambda p: p.target_rate)
    for q, style in ((0.5, "o-"), (0.99, "s-")):
        pts = [(p.target_rate, 1000 * v) for p in phases if (v := p.pct(q)) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"p{round(100 * q)}")
    ax.axhline(1000 * HELD_P99_S, color=_plot.DIRECT, linestyle=":", label="p99 goal")
    ceiling = f"{curve.emulator} alone: bare ceiling ({curve.ceiling_per_s:.0f} msg/s)"
    ax.axvline(curve.ceiling_per_s, color=_plot.FLOOR, linestyle="--", label=ceiling)
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (reports/s, all ranks)")
    ax.set_ylabel("lag (ms)")
    ax.legend(fontsize=8)
    return _plot.save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run each rate and print achieved rate, lag p50/p99/max, backlog and CPU per message."""
    p = cli(__doc__, plot="lag.png", sqs="moto")
    p.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    p.add_argument("--seconds", type=float, default=20.0, help="per rate")
    p.add_argument("--ranks", type=int, default=50)
    p.add_argument("--processes", type=int, default=2, help="sender processes")
    p.add_argument("--drain-timeout-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=5.0, help="per rate, unmeasured (0: none)")
    args = parse(p, argv)
    curve = run(args)
    if args.plot is not None and curve is not None:
        plotted(plot_lag(curve, args.plot / "lag.png"))
    return 0 if curve is not None and all(ph.rows == ph.reported for ph in curve.phases) else 1


def run(args: argparse.Namespace) -> LagCurve | None:
    """Every rate, then the ceiling; None if a rate could not be measured."""
    print(
        f"end-to-end lag (report() -> commit), {args.ranks} ranks in {args.processes} processes,"
        f" open loop, {args.seconds:.0f} s per rate, writer concurrency 2, SQS {args.sqs};"
        f" load average {load()}",
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
    for rate in args.rates:
        try:
            *warm, ph = run_rate(
                rate, seconds=args.seconds, ranks=args.ranks, processes=args.processes,
                drain_timeout_s=args.drain_timeout_s, sqs=args.sqs, warmup_s=args.warmup_s,
            )  # fmt: skip
        except Exception as exc:  # reported as a row: the rate could not be measured
            print(f"{rate:8.0f}  not measured: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            failed = True
            continue
        for w in warm:
            print_phase(w)
        print_phase(ph)
        phases.append(ph)
    with sqs_emulator(args.sqs) as endpoint:
        ceiling, emu_cpu = _sqs.ceiling(endpoint, seconds=min(10.0, args.seconds))
    curve = LagCurve(phases, ceiling, emu_cpu, args.sqs, args.ranks)
    best = curve.held
    print(
        f"highest rate held (p99 <= {HELD_P99_S:.0f} s, achieved >= 95 %, drained):"
        f" {'none' if best is None else f'{best:.0f} msg/s'}; {args.sqs} bare ceiling (send +"
        f" receive + delete, no writer): {ceiling:.0f} msg/s, emulator {1000 * emu_cpu:.2f} ms"
        f" CPU/msg; held/ceiling {'n/a' if best is None else f'{best / ceiling:.2f}'};"
        f" load average {load()}",
        flush=True,
    )
    if lost := sum(ph.reported - ph.rows for ph in phases):
        print(f"  {lost} reported rows not in the database")
    return None if failed else curve
