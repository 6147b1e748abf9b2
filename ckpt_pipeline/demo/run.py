"""``ckpt-pipeline demo``: the whole pipeline on one machine, with a preemption in the middle.

moto's SQS server, a PostgreSQL database (``DATABASE_URL``, else the local server, else a
throwaway cluster), the real writer behind the local event source, and a real ``torchrun`` job:
N gloo ranks, a tiny DDP model, one checkpoint per epoch. In epoch 3 of the first attempt one rank
is SIGKILLed (no flush, no cleanup); torchrun tears the job down and restarts it as the next
``run_attempt``, which resumes from the latest complete checkpoint it reads from the database.
The verification is read back from the database.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ckpt_pipeline.demo.checks import JobVerification, verify_job
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.embedded_pg import database_url_or_embedded
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, LocalPipeline, local_pipeline

PREEMPT_EPOCH = 2  # zero-based: "during epoch 3"
EPOCH_SECONDS = 0.4  # simulated compute per epoch, so progress is visible


@dataclass(frozen=True)
class DemoResult:
    """What the demo did and what the database says about it."""

    job_id: str
    ranks: int
    epochs: int
    preempted_rank: int | None
    torchrun_exit: int
    verification: JobVerification
    peak_writer_connections: int
    peak_connections: int
    peak_by_application: dict[str, int]
    dlq_depth: int
    seconds: float

    @property
    def problems(self) -> list[str]:
        found = self.verification.problems(epochs=self.epochs, ranks=self.ranks)
        if self.torchrun_exit != 0:
            found.append(f"torchrun exited with {self.torchrun_exit}")
        if self.dlq_depth:
            found.append(f"{self.dlq_depth} messages in the DLQ")
        if self.peak_writer_connections > 2:
            found.append(f"{self.peak_writer_connections} writer connections (> 2)")
        return found


def torchrun_command(
    *, ranks: int, epochs: int, job_id: str, workdir: Path, preempt: str, restarts: int
) -> list[str]:
    """The ``torchrun`` invocation of the demo's training job."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={ranks}", f"--max-restarts={restarts}", "--monitor-interval=0.2",
        "-m", "ckpt_pipeline.demo.train_worker",
        "--job-id", job_id, "--workdir", str(workdir), "--epochs", str(epochs),
        "--epoch-seconds", str(EPOCH_SECONDS), "--preempt", preempt,
    ]  # fmt: skip


def _progress_view(workdir: Path, pipeline: LocalPipeline, job_id: str, ranks: int) -> Group:
    table = Table(title=f"job {job_id}: {ranks} ranks", expand=False)
    for column in ("rank", "attempt", "epoch", "phase"):
        table.add_column(column)
    for rank in range(ranks):
        path = workdir / "progress" / f"rank-{rank}.json"
        try:
            p = json.loads(path.read_text())
        except (OSError, ValueError):
            table.add_row(str(rank), "-", "-", "starting")
            continue
        table.add_row(str(rank), str(p["attempt"]), str(p["epoch"]), p["phase"])
    with psycopg.connect(pipeline.database_url, application_name="ckpt-monitor") as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE is_complete) FROM training_checkpoints"
            " WHERE job_id = %s",
            (job_id,),
        ).fetchone()
    rows, complete = row if row else (0, 0)
    stats = pipeline.source.stats
    return Group(
        table,
        Text(
            f"database: {rows} checkpoints, {complete} complete | queue depth {pipeline.depth()}"
            f" | writer: {stats.batches} batches, {stats.records} records"
        ),
    )


def run_demo(
    database_url: str,
    *,
    ranks: int = 8,
    epochs: int = 5,
    preemption: bool = True,
    workdir: Path,
    console: Console | None = None,
) -> DemoResult:
    """Run the training job through the local pipeline and verify the database."""
    console = console or Console(stderr=True)
    job_id = f"demo-{uuid.uuid4().hex[:8]}"
    victim = ranks - 1 if preemption and ranks > 1 and epochs > PREEMPT_EPOCH else None
    started = time.monotonic()
    with (
        local_pipeline(database_url, concurrency=2) as pipeline,
        PeakConnections(database_url) as peak,
    ):
        env = os.environ | pipeline.client_env()
        env |= {
            "CKPT_DEMO_DATABASE_URL": database_url,
            "OMP_NUM_THREADS": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(workdir / "torchinductor"),
        }
        command = torchrun_command(
            ranks=ranks,
            epochs=epochs,
            job_id=job_id,
            workdir=workdir,
            preempt=f"0:{PREEMPT_EPOCH}:{victim}" if victim is not None else "",
            restarts=1 if victim is not None else 0,
        )
        log_path = workdir / "torchrun.log"
        with log_path.open("wb") as log, Live(console=console, refresh_per_second=4) as live:
            job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            while job.poll() is None:
                live.update(_progress_view(workdir, pipeline, job_id, ranks))
                time.sleep(0.25)
            pipeline.source.drain(until_empty_for_s=1.0, timeout=60)
            live.update(_progress_view(workdir, pipeline, job_id, ranks))
        if job.returncode != 0:
            console.print(f"[red]torchrun failed ({job.returncode}); its log ends:[/red]")
            console.print(log_path.read_text(errors="replace")[-3000:])
        with psycopg.connect(database_url, application_name="ckpt-demo-verify") as conn:
            verification = verify_job(conn, job_id)
        dlq = pipeline.dlq_depth()
    return DemoResult(
        job_id=job_id,
        ranks=ranks,
        epochs=epochs,
        preempted_rank=victim,
        torchrun_exit=job.returncode,
        verification=verification,
        peak_writer_connections=peak.peak(WRITER_APPLICATION_NAME),
        peak_connections=peak.peak_total,
        peak_by_application=dict(peak.peak_by_application),
        dlq_depth=dlq,
        seconds=time.monotonic() - started,
    )


def render_result(result: DemoResult, console: Console) -> None:
    """The seed's verification, as a table."""
    v = result.verification
    table = Table(title="verification (read from PostgreSQL)")
    table.add_column("check")
    table.add_column("result")
    table.add_row("rows in training_checkpoints", f"{v.row_count} (expected {result.epochs})")
    table.add_row(
        "shards per checkpoint (newest attempt)",
        ", ".join(f"{c.step}:{c.shards_of_attempt}/a{c.run_attempt}" for c in v.checkpoints),
    )
    table.add_row("all complete", str(v.all_complete))
    latest = v.latest_complete
    table.add_row(
        "latest complete checkpoint",
        f"step {latest[0]}, epoch {latest[1]}, run_attempt {latest[2]}" if latest else "none",
    )
    preempted = "none" if result.preempted_rank is None else f"rank {result.preempted_rank}"
    table.add_row("preempted (SIGKILL in epoch 3)", preempted)
    others = ", ".join(
        f"{app} {n}"
        for app, n in sorted(result.peak_by_application.items())
        if app != WRITER_APPLICATION_NAME
    )
    table.add_row(
        "peak DB connections",
        f"writer {result.peak_writer_connections} (the demo's own: {others or 'none'})",
    )
    table.add_row("messages in the DLQ", str(result.dlq_depth))
    if v.lag_p50_s is not None and v.lag_p99_s is not None:
        table.add_row(
            "end-to-end lag p50 / p99", f"{v.lag_p50_s * 1000:.0f} ms / {v.lag_p99_s * 1000:.0f} ms"
        )
    table.add_row("wall time", f"{result.seconds:.1f} s")
    console.print(table)
    if result.problems:
        console.print("[red]FAILED:[/red] " + "; ".join(result.problems))
    else:
        console.print("[green]OK[/green]: every checkpoint recorded once, by every rank.")


def main_demo(args: argparse.Namespace) -> int:
    """Entry point of ``ckpt-pipeline demo`` (and ``--compare``)."""
    console = Console()
    if args.compare:
        from ckpt_pipeline.demo.compare import main_compare

        return main_compare(args, console)
    if args.preemption and (args.epochs <= PREEMPT_EPOCH or args.ranks < 2):
        # The preemption happens in epoch PREEMPT_EPOCH + 1 and kills a rank other than rank 0.
        print(
            f"ckpt-pipeline demo: --epochs {args.epochs} / --ranks {args.ranks} is too small for"
            f" the preemption in epoch {PREEMPT_EPOCH + 1} (needs --epochs >= {PREEMPT_EPOCH + 1}"
            " and --ranks >= 2); pass --no-preemption to run without it",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="ckpt-demo-") as tmp, database_url_or_embedded() as db:
        console.print(f"database: {db.kind}; work dir {tmp}")
        result = run_demo(
            db.url,
            ranks=args.ranks,
            epochs=args.epochs,
            preemption=args.preemption,
            workdir=Path(tmp),
            console=console,
        )
        render_result(result, console)
    return 1 if result.problems else 0
