"""The database half of ``python -m bench read_paths``: a job of 100,000 ranks x 100 checkpoints
filled in SQL (generate_series, not per-row inserts), and the read paths' times on it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from trainer_client.integrations.resume import _BIGINT_MAX, _LATEST_COMPLETE

# One job: `checkpoints` complete checkpoints (steps 100, 200, ...) of `ranks` shard rows, each
# row as a DCP rank's report pins it (uri, bytes, ETag), a loss and an empty metrics object. The
# checkpoint row holds what the writer keeps of it (migration 0012): the exact sum of its shards'
# losses (the same expression as theirs, as the double it is stored as) and their number.
_FILL_CHECKPOINTS = """
INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size, shards_present,
                                  is_complete, first_reported_at, completed_at, value_sums,
                                  oldest_run_attempt)
SELECT %(job)s, s * 100, s, 0, %(ranks)s, %(ranks)s, true, now(), now(),
       (SELECT jsonb_build_object('loss', jsonb_build_array(
                   sum((1.0 / s + r * 1e-9)::double precision::text::numeric), count(*)))
        FROM generate_series(0, %(ranks)s - 1) r),
       0
FROM generate_series(1, %(checkpoints)s) s
"""
_FILL_SHARDS = """
INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch, world_size, uri,
                                        loss, size_bytes, objects, reported_at)
SELECT %(job)s, s * 100, r, 0, s, %(ranks)s, u, 1.0 / s + r * 1e-9, 16,
       jsonb_build_array(jsonb_build_object('uri', u, 'bytes', 16,
                                            'etag', '"0123456789abcdef0123456789abcdef"')),
       now()
FROM generate_series(1, %(checkpoints)s) s, generate_series(0, %(ranks)s - 1) r,
     LATERAL (SELECT 's3://bench/' || %(job)s || '/step-' || s * 100 || '/__' || r
                     || '_0.distcp') x(u)
"""


@dataclass(frozen=True)
class Job:
    """A filled job."""

    job_id: str
    ranks: int
    checkpoints: int

    @property
    def rows(self) -> int:
        return self.ranks * self.checkpoints


@dataclass
class Lookup:
    """Median milliseconds of each read of one job."""

    job: Job
    find_ms: float  # the decision: the newest complete checkpoint's row
    server_ms: float  # the lookup statement inside the server (EXPLAIN ANALYZE)
    server_nojit_ms: float  # the same with the bench's own session at jit = off
    rows_ms: float  # the lookup statement's round trip: the checkpoint and its shard rows
    copy_ms: float  # the same rows as COPY text: their transfer without psycopg's row objects
    helper_ms: float  # latest_complete_checkpoint(check_files=False), connection included
    best_ms: float  # best_complete_checkpoint(metric="loss", check_files=False)
    listing_ms: float  # job_checkpoints(metric="loss"): `checkpoints` and the prune planner


def filled(url: str, job: Job) -> bool:
    """Whether ``job`` is in the database already (a kept bench database, ``--database-url``)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM training_checkpoints WHERE job_id = %s", (job.job_id,)
        ).fetchone()
    return row is not None and int(row[0]) == job.checkpoints


def fill(url: str, job: Job) -> float:
    """Fill ``job`` (foreign keys unchecked while filling: bench setup); seconds taken."""
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        params = {"job": job.job_id, "ranks": job.ranks, "checkpoints": job.checkpoints}
        conn.execute(_FILL_CHECKPOINTS, params)
        conn.execute(_FILL_SHARDS, params)
        conn.execute("VACUUM ANALYZE training_checkpoints, training_checkpoint_shards")
    return time.perf_counter() - t0


def _median_ms(call: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(url: str, job: Job, *, rounds: int) -> Lookup:
    """The read paths' median times over ``rounds`` (after one warm-up each)."""
    from lambda_writer import job_checkpoints
    from trainer_client.integrations.best import best_complete_checkpoint
    from trainer_client.integrations.resume import latest_complete_checkpoint

    params = {"job_id": job.job_id, "before": _BIGINT_MAX}
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:

        def find() -> Any:
            return conn.execute(
                "SELECT step, epoch, run_attempt, world_size FROM complete_checkpoints"
                " WHERE job_id = %s ORDER BY step DESC LIMIT 1",
                (job.job_id,),
            ).fetchone()

        literal = _LATEST_COMPLETE.replace("%(job_id)s", "'" + job.job_id + "'").replace(
            "%(before)s", str(_BIGINT_MAX)
        )

        def copy() -> int:
            with conn.cursor().copy(f"COPY ({literal}) TO STDOUT") as rows:
                return sum(len(block) for block in rows)

        def server() -> float:
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + _LATEST_COMPLETE, params
            ).fetchone()  # type: ignore[misc]
            return float(plan[0]["Execution Time"])

        def rows() -> Any:
            return conn.execute(_LATEST_COMPLETE, params).fetchall()

        def listing() -> Any:
            return job_checkpoints(conn, job.job_id, metric="loss")

        def helper() -> Any:
            return latest_complete_checkpoint(job.job_id, database_url=url, check_files=False)

        def best() -> Any:
            return best_complete_checkpoint(job.job_id, database_url=url, check_files=False)

        for call in (find, rows, helper):
            call()  # warm the cache: the figures are of a server that has the pages
        server_times = [server() for _ in range(rounds)]
        conn.execute("SET jit = off")  # the bench's session only: what JIT costs the lookup
        server_nojit = [server() for _ in range(rounds)]
        conn.execute("RESET jit")
        return Lookup(
            job,
            find_ms=_median_ms(find, rounds),
            server_ms=statistics.median(server_times),
            server_nojit_ms=statistics.median(server_nojit),
            rows_ms=_median_ms(rows, rounds),
            copy_ms=_median_ms(copy, rounds),
            helper_ms=_median_ms(helper, rounds),
            best_ms=_median_ms(best, rounds),
            listing_ms=_median_ms(listing, rounds),
        )


def table(lookups: Sequence[Lookup]) -> list[str]:
    """The lookup table's lines."""
    lines = [
        "| job | shard rows | the decision (newest complete checkpoint's row) | its shard rows"
        " in the server (jit on / off) | round trip: rows / COPY text |"
        " latest_complete_checkpoint(check_files=False) | best by loss | checkpoints / prune"
        " listing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in lookups:
        lines.append(
            f"| {x.job.ranks:,} ranks x {x.job.checkpoints:,} | {x.job.rows:,}"
            f" | {x.find_ms:.1f} ms | {x.server_ms:.1f} / {x.server_nojit_ms:.1f} ms"
            f" | {x.rows_ms:.0f} / {x.copy_ms:.0f} ms"
            f" | {x.helper_ms:.0f} ms | {x.best_ms:,.1f} ms | {x.listing_ms:,.1f} ms |"
        )
    return lines
