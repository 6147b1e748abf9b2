"""The database half of ``python -m bench read_paths``: a job of 100,000 ranks x 100 checkpoints
filled in SQL (generate_series, not per-row inserts), and the read paths' times on it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from bench._harness import median_ms

# _LATEST_AGGREGATED: the lookup reading the shard rows, aggregated, even where a manifest
# exists: the walk's statement before migration 0013 (and of a role that may not read the
# manifests), in one round trip; a checkpoint without a manifest is read the same way, in a
# second round trip after its manifest's probe.
from trainer_client.restart.walk import _BIGINT_MAX, _LATEST_AGGREGATED

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
    server_ms: float  # the aggregated lookup inside the server (EXPLAIN ANALYZE: no output)
    server_nojit_ms: float  # the same with the bench's own session at jit = off
    walk_ms: float  # the resume's lookup: the walk's first candidate, its pins in the client
    aggregated_ms: float  # the same from the shard rows (_LATEST_AGGREGATED: no manifest)
    build_ms: float  # the manifest's build for the newest checkpoint: what it adds to the settle
    per_row_ms: float  # the same shard rows read one row per shard (SHARD_ROWS), decoded
    decode_ms: float  # the candidate's rows decoded into ShardRecords (verification's first step)
    expect_ms: float  # ... and into the objects to verify (expectations(): a pin validated each)
    helper_ms: float  # latest_complete_checkpoint(check_files=False), connection included
    best_ms: float  # best_complete_checkpoint(metric="loss", check_files=False)
    listing_ms: float  # job_checkpoints(metric="loss"): `checkpoints` and the prune planner
    split: dict[str, float]  # server times (EXPLAIN ANALYZE) of parts of the lookup's read


# Parts of the lookup's read of the newest checkpoint's shard rows, each timed by EXPLAIN
# (ANALYZE) in the server: what the scan costs, and what outputting each column does.
_SPLIT = {
    "count(*): the index range and its heap rows": "count(*)",
    "string_agg(rank::text)": "length(string_agg(s.rank::text, ','))",
    "string_agg(uri)": "length(string_agg(s.uri, E'\\n'))",
    "string_agg(objects::text): the pins, jsonb output": "length(string_agg(s.objects::text, ','))",
}


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


def build_manifests(url: str, job: Job) -> tuple[int, float]:
    """Build the manifest of each of ``job``'s checkpoints that has none (what the writer's settle
    does when it marks one complete; the fill writes rows, not through the writer): how many,
    and seconds taken."""
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        steps = conn.execute(
            "SELECT c.step FROM training_checkpoints c WHERE c.job_id = %s AND NOT EXISTS ("
            " SELECT FROM training_checkpoint_manifests m"
            " WHERE m.job_id = c.job_id AND m.step = c.step) ORDER BY c.step",
            (job.job_id,),
        ).fetchall()
        for (step,) in steps:
            conn.execute("SELECT ckpt_build_manifest(%s, %s)", (job.job_id, step))
        conn.execute("VACUUM ANALYZE training_checkpoint_manifests")
    return len(steps), time.perf_counter() - t0


def _explain_ms(conn: Any, sql: str, params: dict[str, Any]) -> tuple[float, int]:
    """Execution time and shared buffers touched, by EXPLAIN (ANALYZE, BUFFERS) in the server."""
    (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
    top = plan[0]
    buffers = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return float(top["Execution Time"]), int(buffers)


def measure(url: str, job: Job, *, rounds: int) -> Lookup:
    """The read paths' median times over ``rounds`` (after one warm-up each)."""
    from lambda_writer import job_checkpoints
    from trainer_client.restart.best import best_complete_checkpoint
    from trainer_client.restart.lookup import latest_complete_checkpoint
    from trainer_client.restart.shard_rows import SHARD_ROWS, ShardRows
    from trainer_client.restart.walk import complete_checkpoints
    from trainer_client.storage.verify import expectations

    params = {"job_id": job.job_id, "before": _BIGINT_MAX}
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:

        def find() -> Any:
            return conn.execute(
                "SELECT step, epoch, run_attempt, world_size FROM complete_checkpoints"
                " WHERE job_id = %s ORDER BY step DESC LIMIT 1",
                (job.job_id,),
            ).fetchone()

        step, _, attempt, _ = find()
        key = {"job_id": job.job_id, "step": step, "run_attempt": attempt}

        def walk() -> Any:
            return next(complete_checkpoints(conn, job.job_id))

        def aggregated() -> Any:
            return conn.execute(_LATEST_AGGREGATED, params).fetchone()

        def build() -> Any:
            # In a transaction rolled back: the newest manifest as the settle builds it, the
            # stored one left as it was.
            with conn.transaction(force_rollback=True):
                conn.execute("SELECT ckpt_build_manifest(%s, %s)", (job.job_id, step))

        def per_row() -> Any:
            return ShardRows.from_rows(conn.execute(SHARD_ROWS, key).fetchall())

        def decoded() -> Any:
            return walk()[4].records

        def expected() -> Any:
            return expectations(walk()[4].values())

        def listing() -> Any:
            return job_checkpoints(conn, job.job_id, metric="loss")

        def helper() -> Any:
            return latest_complete_checkpoint(job.job_id, database_url=url, check_files=False)

        def best() -> Any:
            return best_complete_checkpoint(job.job_id, database_url=url, check_files=False)

        for call in (find, walk, aggregated, per_row, helper):
            call()  # warm the cache: the figures are of a server that has the pages
        server_times = [_explain_ms(conn, _LATEST_AGGREGATED, params)[0] for _ in range(rounds)]
        split = {}
        for name, aggregate in _SPLIT.items():
            sql = (
                f"SELECT {aggregate} FROM training_checkpoint_shards s WHERE s.job_id ="
                " %(job_id)s AND s.step = %(step)s AND s.run_attempt = %(run_attempt)s"
            )
            split[name] = statistics.median(_explain_ms(conn, sql, key)[0] for _ in range(rounds))
        conn.execute("SET jit = off")  # the bench's session only: what JIT costs the lookup
        server_nojit = [_explain_ms(conn, _LATEST_AGGREGATED, params)[0] for _ in range(rounds)]
        conn.execute("RESET jit")
        walk_ms = median_ms(walk, rounds)
        return Lookup(
            job,
            find_ms=median_ms(find, rounds),
            server_ms=statistics.median(server_times),
            server_nojit_ms=statistics.median(server_nojit),
            walk_ms=walk_ms,
            aggregated_ms=median_ms(aggregated, rounds),
            build_ms=median_ms(build, rounds),
            per_row_ms=median_ms(per_row, rounds),
            decode_ms=median_ms(decoded, rounds) - walk_ms,
            expect_ms=median_ms(expected, rounds) - walk_ms,
            helper_ms=median_ms(helper, rounds),
            best_ms=median_ms(best, rounds),
            listing_ms=median_ms(listing, rounds),
            split=split,
        )


def table(lookups: Sequence[Lookup]) -> list[str]:
    """The lookup table's lines, then the server's split of each job's read."""
    lines = [
        "| job | shard rows | the decision | the aggregated lookup in the server (jit on / off) |"
        " the lookup: decision + pins in the client | the same from the shard rows (no manifest)"
        " | the manifest's build (settle) | the same rows one per row |"
        " + decoded / + expectations | latest_complete_checkpoint(check_files=False) |"
        " best by loss | checkpoints / prune listing |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in lookups:
        lines.append(
            f"| {x.job.ranks:,} ranks x {x.job.checkpoints:,} | {x.job.rows:,}"
            f" | {x.find_ms:.1f} ms | {x.server_ms:.1f} / {x.server_nojit_ms:.1f} ms"
            f" | {x.walk_ms:.1f} ms | {x.aggregated_ms:.1f} ms | {x.build_ms:.0f} ms"
            f" | {x.per_row_ms:.0f} ms"
            f" | +{x.decode_ms:.0f} / +{x.expect_ms:.0f} ms"
            f" | {x.helper_ms:.0f} ms | {x.best_ms:,.1f} ms | {x.listing_ms:,.1f} ms |"
        )
    for x in lookups:
        parts = ", ".join(f"{name} {ms:.1f} ms" for name, ms in x.split.items())
        lines.append(f"server split, {x.job.ranks:,} x {x.job.checkpoints:,}: {parts}")
    return lines
