"""The design this project replaces, reproduced faithfully so it can fail beside the fix.

Every rank opens its own pool of ``pool_size`` connections and, at each checkpoint barrier,
UPSERTs its shard and the checkpoint row directly. Against a database capped at
``max_connections`` (30 on the seed's RDS instance) the ranks × pool_size connections do not
fit: pools cannot fill, ranks time out waiting for a connection, and their rows are lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

logger = logging.getLogger(__name__)

# What the seed ran on each rank: one UPSERT per shard, then one per checkpoint row.
SEED_UPSERT_SHARD = """
INSERT INTO training_checkpoint_shards
    (job_id, step, rank, run_attempt, epoch, world_size, uri, loss, reported_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (job_id, step, rank) DO UPDATE
SET uri = EXCLUDED.uri, loss = EXCLUDED.loss, updated_at = now()
"""
SEED_UPSERT_CHECKPOINT = """
INSERT INTO training_checkpoints
    (job_id, step, epoch, run_attempt, world_size, shards_present, is_complete, first_reported_at)
VALUES (%(job)s, %(step)s, %(epoch)s, 0, %(world)s, 1, %(world)s = 1, now())
ON CONFLICT (job_id, step) DO UPDATE
SET shards_present = training_checkpoints.shards_present + 1,
    is_complete = training_checkpoints.shards_present + 1 >= training_checkpoints.world_size,
    updated_at = now()
"""
APPLICATION_NAME = "seed-direct-write"


@dataclass
class DirectWriteResult:
    """What the direct-write run achieved and what it lost."""

    ranks: int
    checkpoints: int
    succeeded: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def attempted(self) -> int:
        return self.ranks * self.checkpoints


class _ConnectErrors(logging.Handler):
    """Counts the pool's failed connection attempts (it logs them and keeps retrying)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count_lock = threading.Lock()
        self.errors: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "too many clients" in message or "remaining connection slots" in message:
            with self.count_lock:
                self.errors["too many connections (pool fill)"] += 1


def _reason(exc: BaseException) -> str:
    first_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first_line}"[:160]


def run_direct_write(
    conninfo: str,
    *,
    job_id: str,
    ranks: int,
    checkpoints: int,
    pool_size: int = 5,
    connection_timeout_s: float = 10.0,
) -> DirectWriteResult:
    """Run ``ranks`` threads, each with its own pool, writing ``checkpoints`` barrier UPSERTs."""
    result = DirectWriteResult(ranks=ranks, checkpoints=checkpoints)
    lock = threading.Lock()
    barrier = threading.Barrier(ranks)
    pool_log = logging.getLogger("psycopg.pool")
    counter = _ConnectErrors()
    pool_log.addHandler(counter)

    def rank_main(rank: int) -> None:
        pool = ConnectionPool(
            conninfo,
            min_size=pool_size,
            max_size=pool_size,
            timeout=connection_timeout_s,
            kwargs={"application_name": APPLICATION_NAME, "prepare_threshold": None},
            open=False,
        )
        pool.open(wait=False)
        try:
            for ckpt in range(checkpoints):
                barrier.wait()
                step = (ckpt + 1) * 100
                try:
                    with pool.connection() as conn, conn.transaction():
                        conn.execute(
                            SEED_UPSERT_CHECKPOINT,
                            {"job": job_id, "step": step, "epoch": ckpt, "world": ranks},
                        )
                        conn.execute(
                            SEED_UPSERT_SHARD,
                            (
                                job_id,
                                step,
                                rank,
                                0,
                                ckpt,
                                ranks,
                                f"file:///seed/{step}/{rank}",
                                0.5,
                                datetime.now(UTC),
                            ),
                        )
                except (psycopg.Error, PoolTimeout) as exc:
                    with lock:
                        result.failed += 1
                        result.errors[_reason(exc)] += 1
                else:
                    with lock:
                        result.succeeded += 1
        finally:
            pool.close()

    started = time.monotonic()
    threads = [
        threading.Thread(target=rank_main, args=(r,), name=f"seed-rank-{r}") for r in range(ranks)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        pool_log.removeHandler(counter)
    result.elapsed_s = time.monotonic() - started
    result.errors.update(counter.errors)
    return result
