"""``ckpt-pipeline demo --compare``: the seed's direct-write design beside the pipeline, both
against a PostgreSQL capped like the seed's RDS instance (max_connections 30, statement_timeout
5 s for the application role).
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ckpt_pipeline.demo.direct_write import APPLICATION_NAME, DirectWriteResult, run_direct_write
from ckpt_pipeline.demo.fanin import FanInResult, count_rows, run_pipeline_fanin
from ckpt_pipeline.local.db_monitor import PeakConnections
from ckpt_pipeline.local.embedded_pg import create_login_role, start_throwaway_cluster
from ckpt_pipeline.local.pipeline import WRITER_APPLICATION_NAME, local_pipeline
from lambda_writer import apply_migrations, connect_url

SEED_MAX_CONNECTIONS = 30
SEED_STATEMENT_TIMEOUT = "5s"
SEED_POOL_SIZE = 5
APP_ROLE = "seed_app"
# Far beyond what the pipeline needs here; a writer that cannot write fails fast instead of
# keeping the demo waiting for the fan-in's default ten minutes.
PIPELINE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class CompareResult:
    """Both designs on the same capped database."""

    ranks: int
    checkpoints: int
    direct: DirectWriteResult
    direct_rows: int
    direct_peak_connections: int
    pipeline: FanInResult
    pipeline_rows: int
    pipeline_peak_writer_connections: int
    pipeline_dlq: int

    @property
    def expected_rows(self) -> int:
        return self.ranks * self.checkpoints


def run_compare(*, ranks: int, checkpoints: int, spool_dir: Path) -> CompareResult:
    """Run the direct-write baseline, then the pipeline, on one capped throwaway cluster."""
    with start_throwaway_cluster(max_connections=SEED_MAX_CONNECTIONS) as cluster:
        direct_db = cluster.create_database(f"seed_{uuid.uuid4().hex[:6]}")
        pipe_db = cluster.create_database(f"pipe_{uuid.uuid4().hex[:6]}")
        role_urls = {}
        for db in (direct_db, pipe_db):
            with connect_url(db) as conn:
                apply_migrations(conn)
            role_urls[db] = create_login_role(
                cluster.admin_url, db, APP_ROLE, statement_timeout=SEED_STATEMENT_TIMEOUT
            )
        with PeakConnections(direct_db) as direct_peak:
            direct = run_direct_write(
                role_urls[direct_db],
                job_id="seed",
                ranks=ranks,
                checkpoints=checkpoints,
                pool_size=SEED_POOL_SIZE,
            )
        direct_rows, _ = count_rows(direct_db, "seed")
        with local_pipeline(pipe_db, writer_database_url=role_urls[pipe_db]) as pipeline:
            with PeakConnections(pipe_db) as pipe_peak:
                fanin = run_pipeline_fanin(
                    pipeline,
                    job_id="pipeline",
                    ranks=ranks,
                    checkpoints=checkpoints,
                    spool_dir=spool_dir,
                    timeout_s=PIPELINE_TIMEOUT_S,
                )
            pipeline_rows, _ = count_rows(pipe_db, "pipeline")
            dlq = pipeline.dlq_depth()
        return CompareResult(
            ranks=ranks,
            checkpoints=checkpoints,
            direct=direct,
            direct_rows=direct_rows,
            direct_peak_connections=direct_peak.peak(APPLICATION_NAME),
            pipeline=fanin,
            pipeline_rows=pipeline_rows,
            pipeline_peak_writer_connections=pipe_peak.peak(WRITER_APPLICATION_NAME),
            pipeline_dlq=dlq,
        )


def render_compare(result: CompareResult, console: Console) -> None:
    """Side-by-side table of the two designs."""
    table = Table(
        title=f"{result.ranks} ranks x {result.checkpoints} checkpoints, max_connections"
        f" {SEED_MAX_CONNECTIONS}, statement_timeout {SEED_STATEMENT_TIMEOUT}"
    )
    table.add_column("")
    table.add_column(f"direct write (pool {SEED_POOL_SIZE} per rank)")
    table.add_column("pipeline (SQS FIFO + writer)")
    d, p = result.direct, result.pipeline
    table.add_row("shard rows in DB", f"{result.direct_rows}/{result.expected_rows}",
                  f"{result.pipeline_rows}/{result.expected_rows}")  # fmt: skip
    table.add_row("failed writes / reports", str(d.failed), str(sum(p.errors.values())))
    table.add_row(
        "peak DB connections",
        str(result.direct_peak_connections),
        f"{result.pipeline_peak_writer_connections} (writer)",
    )
    table.add_row("DLQ", "-", str(result.pipeline_dlq))
    all_rows = f"{p.all_rows_seconds:.1f} s" if p.all_rows_seconds is not None else "never"
    table.add_row("time until every row", "never" if d.failed else f"{d.elapsed_s:.1f} s", all_rows)
    console.print(table)
    for reason, count in d.errors.most_common(5):
        console.print(f"  direct write error x{count}: {reason}")


def main_compare(args: argparse.Namespace, console: Console) -> int:
    """Run and print the comparison; non-zero if the pipeline lost anything."""
    ranks = args.compare_ranks
    console.print(
        f"direct write: {ranks} ranks x pool {SEED_POOL_SIZE} = {ranks * SEED_POOL_SIZE}"
        f" connections wanted against max_connections {SEED_MAX_CONNECTIONS}"
    )
    with tempfile.TemporaryDirectory(prefix="ckpt-compare-") as tmp:
        result = run_compare(ranks=ranks, checkpoints=args.epochs, spool_dir=Path(tmp))
    render_compare(result, console)
    lost = result.expected_rows - result.pipeline_rows
    return 0 if lost == 0 and result.pipeline_dlq == 0 else 1
