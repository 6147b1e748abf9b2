"""Where a batch's time goes: client CPU, the server's time inside ``ckpt_write_batch``, the
commit's WAL flush, and the rest (round trips, scheduling on a shared machine).

Shared by ``bench.writer_throughput`` (the fixed per-batch cost, issue 15 item 5) and
``bench.capacity`` (schemas old vs new, the commit floor).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lambda_writer import sql
from lambda_writer.connection import Connection, connect_url
from lambda_writer.migrate import apply_migrations, load_migrations
from lambda_writer.planning import BatchPlan, plan_batch
from lambda_writer.records import ValidReport
from lambda_writer.repository import write_batch

BATCH = 10
Write = Callable[[Connection, BatchPlan], object]

# The writer's statement before 0005 (20 binary column arrays to 0003/0004's ckpt_write_batch),
# kept here so that the benches measure it beside today's in the same run.
ARRAYS_STATEMENT = """
SELECT shard_rows_changed, checkpoints_recounted FROM ckpt_write_batch(
    %(c_job_id)b::text[], %(c_step)b::bigint[], %(c_run_attempt)b::integer[],
    %(c_epoch)b::bigint[], %(c_world_size)b::integer[], %(c_first_reported_at)b::timestamptz[],
    %(s_job_id)b::text[], %(s_step)b::bigint[], %(s_rank)b::integer[],
    %(s_run_attempt)b::integer[], %(s_epoch)b::bigint[], %(s_world_size)b::integer[],
    %(s_uri)b::text[], %(s_loss)b::double precision[], %(s_metrics)b::text[]::jsonb[],
    %(s_size_bytes)b::bigint[], %(s_sha256)b::text[], %(s_extra)b::text[]::jsonb[],
    %(s_sqs_message_id)b::text[], %(s_reported_at)b::timestamptz[])
"""


def arrays_params(plan: BatchPlan) -> dict[str, list[Any]]:
    """Column arrays for :data:`ARRAYS_STATEMENT`, in key order (the release before 0005)."""
    cps, shards = plan.checkpoints, plan.shards
    return {
        "c_job_id": [r.job_id for r in cps],
        "c_step": [r.step for r in cps],
        "c_run_attempt": [r.run_attempt for r in cps],
        "c_epoch": [r.epoch for r in cps],
        "c_world_size": [r.world_size for r in cps],
        "c_first_reported_at": [r.first_reported_at for r in cps],
        "s_job_id": [r.job_id for r in shards],
        "s_step": [r.step for r in shards],
        "s_rank": [r.rank for r in shards],
        "s_run_attempt": [r.run_attempt for r in shards],
        "s_epoch": [r.epoch for r in shards],
        "s_world_size": [r.world_size for r in shards],
        "s_uri": [r.uri for r in shards],
        "s_loss": [r.loss for r in shards],
        "s_metrics": [r.metrics_json for r in shards],
        "s_size_bytes": [r.size_bytes for r in shards],
        "s_sha256": [r.sha256 for r in shards],
        "s_extra": [r.extra_json for r in shards],
        "s_sqs_message_id": [r.sqs_message_id for r in shards],
        "s_reported_at": [r.reported_at for r in shards],
    }


def write_arrays(conn: Connection, plan: BatchPlan) -> object:
    """One batch through the 20-array statement (autocommit: its own transaction)."""
    return conn.execute(ARRAYS_STATEMENT, arrays_params(plan)).fetchone()


def write_json_function(conn: Connection, plan: BatchPlan) -> object:
    """One batch through 0005's statement, ``ckpt_write_batch_json`` (the release before 0006;
    on a 0006 database the same call runs the body 0006 gave that function)."""
    return conn.execute(sql.WRITE_BATCH_IN_TRANSACTION, sql.write_params(plan)).fetchone()


def apply_schema(url: str, upto: int | None) -> None:
    """Migrate a fresh database to version ``upto`` (all when None; below that, unrecorded)."""
    with connect_url(url) as conn:
        if upto is None:
            apply_migrations(conn)
            return
        with conn.transaction():
            for migration in load_migrations():
                if migration.version <= upto:
                    conn.execute(migration.sql.encode())


def commit_floor_ms(url: str, commits: int = 200) -> float:
    """Mean time of a one-row autocommitted INSERT: the server's commit (WAL flush) floor."""
    with connect_url(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (x integer)")
        began = time.perf_counter()
        for i in range(commits):
            conn.execute("INSERT INTO bench_commit_probe VALUES (%s)", (i,))
        return 1000 * (time.perf_counter() - began) / commits


@dataclass(frozen=True)
class BatchProfile:
    """Milliseconds per batch of one run of the real repository at batch 10."""

    wall: float
    client_cpu: float  # this process: plan_batch, parameters, psycopg's dumping and protocol
    plan_cpu: float  # of which plan_batch alone (the same for every statement)
    function: float  # the server's time inside the batch function (pg_stat_user_functions)
    commit_floor: float  # a one-row commit on the same database
    wall_nosync: float  # the same run with synchronous_commit off (diagnostic only)

    def line(self, label: str) -> str:
        rest = self.wall - self.client_cpu - self.function
        return (
            f"  {label}: {self.wall:.2f} ms per batch = client CPU {self.client_cpu:.2f}"
            f" (plan_batch {self.plan_cpu:.2f}, parameters + psycopg"
            f" {self.client_cpu - self.plan_cpu:.2f})"
            f" + inside the function {self.function:.2f} + the rest {rest:.2f} (commit"
            f" floor {self.commit_floor:.2f}, round trip, scheduling); with synchronous_commit"
            f" off (diagnostic) {self.wall_nosync:.2f} ms"
        )


def _function_stats(conn: Connection, name: str) -> tuple[int, float]:
    """(calls, total ms) of function ``name`` so far, this session's pending counts included."""
    # PostgreSQL 15+: the backend's pending counts reach the view when it next goes idle.
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_time), 0) FROM pg_stat_user_functions"
        " WHERE funcname = %s",
        (name,),
    ).fetchone()
    return (0, 0.0) if row is None else (int(row[0]), float(row[1]))


def profile(
    url: str,
    reports: Sequence[ValidReport],
    write: Write = write_batch,
    function_name: str = "ckpt_write_batch_json",
) -> BatchProfile:
    """Write ``reports`` in batches of 10 with ``write`` (whose server side is ``function_name``)
    twice (flush on, then off) and split the time."""
    batches = [reports[i : i + BATCH] for i in range(0, len(reports), BATCH)]
    with connect_url(url, autocommit=True) as conn:
        # Bench connection (superuser), never the writer's: counts time per PL function.
        conn.execute("SET track_functions = 'pl'")
        for batch in batches[:20]:  # warm-up: plpgsql's cached plan, catalog caches
            write(conn, plan_batch(batch))
        walls: list[float] = []
        cpu = function = 0.0
        for nosync in (False, True):
            conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")
            conn.execute(f"SET synchronous_commit = {'off' if nosync else 'on'}")
            calls, total = _function_stats(conn, function_name)
            began, cpu_began = time.perf_counter(), time.process_time()
            for batch in batches:
                write(conn, plan_batch(batch))
            walls.append(1000 * (time.perf_counter() - began) / len(batches))
            if not nosync:
                cpu = 1000 * (time.process_time() - cpu_began) / len(batches)
                calls_after, total_after = _function_stats(conn, function_name)
                function = (total_after - total) / max(1, calls_after - calls)
        cpu_began = time.process_time()
        for batch in batches:
            plan_batch(batch)
        plan_cpu = 1000 * (time.process_time() - cpu_began) / len(batches)
    return BatchProfile(walls[0], cpu, plan_cpu, function, commit_floor_ms(url), walls[1])
