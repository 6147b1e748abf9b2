"""Migration 0012: each checkpoint's values kept by the writer, so that the readers of values
(best, `checkpoints`, the prune planner) read per-checkpoint rows, never every shard row.

The kept sums are compared exactly with the shard rows' own (``values_not_kept``) here, after
every forced interleaving (test_interleavings.py), after any permutation and duplication of a
delivery (test_concurrency.py) and after every fault scenario (tests/e2e/oracle.py).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.embedded_pg import throwaway_database
from lambda_writer import migrations
from lambda_writer.migrate.apply import _apply_once, apply_migrations, load_migrations
from lambda_writer.prune.reads import _SUPERSEDED, _WITH_VALUE, job_checkpoints
from lambda_writer.shared.connection import connect_url
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import ValidReport, classify
from lambda_writer.writer.repository import write_batch
from lambda_writer.writer.sql import write_params
from tests.conftest import ADMIN_URL
from tests.lambda_writer.helpers import body, sqs_messages, values_not_kept

MIGRATIONS = Path(migrations.__file__).parent


def _body_of(name: str, marker: str) -> list[str]:
    text = (MIGRATIONS / name).read_text()
    fn = text.split(marker)[1].split("$fn$")[1]
    return [" ".join(line.split()) for line in re.sub(r"--[^\n]*", "", fn).splitlines()]


def test_0012_is_0009s_count_statement_with_the_values() -> None:
    # The correctness argument (docs/DESIGN.md, Claim 1) carries over: of 0009's statement only
    # the loss's type in the recordset, `moved`'s RETURNING, the checkpoint row's columns (one
    # more joined by min, as first_reported_at) and the count row's insert change; everything
    # added is the values' CTE and their columns.
    old = _body_of("0009_checkpoint_tombstones.sql", "CREATE OR REPLACE FUNCTION ckpt_count_batch(")
    new = _body_of("0012_checkpoint_values.sql", "CREATE OR REPLACE FUNCTION ckpt_count_batch(")
    diff = list(difflib.ndiff([x for x in old if x], [x for x in new if x]))
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = " ".join(line[2:] for line in diff if line.startswith("+ "))
    assert removed == [
        "loss double precision, metrics jsonb, size_bytes bigint, sha256 text,",
        "RETURNING s.job_id, s.step, s.run_attempt",
        "AND m.run_attempt = t.run_attempt)::integer AS delta",
        "completed_at, first_reported_at)",
        "t.first_reported_at",
        "AND d.first_reported_at <= t.first_reported_at)",
        "INSERT INTO training_checkpoint_counts AS k (job_id, step, run_attempt, slot, shards)",
        "SELECT t.job_id, t.step, t.run_attempt, pg_backend_pid(), t.delta",
        "shards = k.shards + EXCLUDED.shards",
    ]
    for piece in (
        "valued AS (",
        "ckpt_shard_values(a.loss, a.metrics)",
        "value_sums = CASE",
        "oldest_run_attempt = LEAST(c.oldest_run_attempt, EXCLUDED.oldest_run_attempt)",
    ):
        assert piece in added


def write(url: str, *bodies: str, before_0015: bool = False) -> None:
    """One batch of ``bodies`` through the writer's own statement (``before_0015``: the statement
    of the writer before the job claims, on a database not migrated that far)."""
    items = [classify(m) for m in sqs_messages(list(bodies))]
    assert all(isinstance(i, ValidReport) for i in items)
    plan = plan_batch([i for i in items if isinstance(i, ValidReport)])
    with connect_url(url, autocommit=True) as conn:
        if before_0015:
            conn.execute(
                "CALL ckpt_write_batch_counted(%s::json, %s::json, NULL, NULL)", write_params(plan)
            )
        else:
            write_batch(conn, plan)


def shard(step: int, attempt: int, rank: int, world: int, **fields: Any) -> str:
    fields.setdefault("metrics", {})
    return body(
        job_id="job-v", step=step, run_attempt=attempt, rank=rank, world_size=world, **fields
    )


def values(url: str, metric: str) -> dict[int, tuple[int, float, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT step, run_attempt, value, shards_valued FROM ckpt_checkpoint_values(%s, %s)",
            ("job-v", metric),
        ).fetchall()
    return {int(s): (int(a), float(v), int(n)) for s, a, v, n in rows}


def test_values_follow_the_newest_attempt_replays_and_tombstones(clean_db: str) -> None:
    # GIVEN ranks 0-1 of attempt 0 (rank 1 twice: a replay), metrics with a non-number and a
    # metrics key named "loss" (never a value: `loss` names the shard's loss)
    write(clean_db, shard(10, 0, 0, 3, loss=0.5, metrics={"acc": 0.25, "loss": 9.0}))
    write(clean_db, shard(10, 0, 1, 3, loss=0.25, metrics={"acc": 0.75}))
    write(clean_db, shard(10, 0, 1, 3, loss=0.25, metrics={"acc": 0.75}))
    assert values(clean_db, "loss")[10] == (0, 0.375, 2)
    assert values(clean_db, "acc")[10] == (0, 0.5, 2)
    # WHEN rank 2 completes attempt 0 (the settle moves the values with the counts)
    write(clean_db, shard(10, 0, 2, 3, loss=0.75, metrics={"acc": 1.0}))
    assert values(clean_db, "loss")[10] == (0, 0.5, 3)
    # WHEN attempt 1 of the step arrives THEN only its shards count; a late attempt-0 report
    # (stored: its rank was absent) does not
    write(clean_db, shard(10, 1, 0, 2, loss=2.0))
    write(clean_db, shard(10, 0, 1, 3, loss=0.25), shard(10, 1, 1, 2, loss=4.0))
    assert values(clean_db, "loss")[10] == (1, 3.0, 2)
    assert values(clean_db, "acc") == {}  # no shard of attempt 1 carries it
    # ... and `checkpoints` counts rank 2's attempt-0 row as superseded
    with psycopg.connect(clean_db) as conn:
        (row,) = job_checkpoints(conn, "job-v", metric="loss")
    assert (row.shard_rows, row.superseded_rows, row.value) == (3, 1, 3.0)
    assert values_not_kept(clean_db) == []
    # WHEN a prune removes the checkpoint THEN a stale report of it is dropped with its values
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(
            "SELECT * FROM ckpt_remove_checkpoints('job-v', %s::json)",
            ('[{"step": 10, "run_attempt": 1, "world_size": 2, "is_complete": true}]',),
        )
    write(clean_db, shard(10, 1, 0, 2, loss=2.0))
    assert values(clean_db, "loss") == {}
    assert values_not_kept(clean_db) == []


def test_two_writers_backends_each_keep_their_part(clean_db: str) -> None:
    # GIVEN one checkpoint written by two connections (two count rows), not yet complete
    write(clean_db, shard(20, 0, 0, 4, loss=0.1), shard(20, 0, 1, 4, loss=0.2))
    write(clean_db, shard(20, 0, 2, 4, loss=0.3))
    # THEN the value reads the row and both count rows; the sums are exact decimals
    attempt, value, valued = values(clean_db, "loss")[20]
    assert (attempt, valued) == (0, 3) and value == pytest.approx(0.2)
    with psycopg.connect(clean_db) as conn:
        (total,) = conn.execute(  # type: ignore[misc]
            "SELECT (ckpt_sum_values(value_sums) -> 'loss' ->> 0)::numeric"
            " FROM training_checkpoint_counts WHERE job_id = 'job-v'"
        ).fetchone()
    assert str(total) == "0.6"
    assert values_not_kept(clean_db) == []


@pytest.fixture
def before_0012() -> Iterator[str]:
    """A database migrated up to 0011 only."""
    with throwaway_database(ADMIN_URL, prefix="ckpt_v12_") as url:
        with connect_url(url) as conn:
            _apply_once(conn, [m for m in load_migrations() if m.version < 12])
        yield url


def test_the_migration_backfills_existing_checkpoints(before_0012: str) -> None:
    # GIVEN checkpoints written before 0012: complete, in progress, and a newer attempt
    write(
        before_0012,
        shard(1, 0, 0, 2, loss=0.1, metrics={"acc": 1}),
        shard(1, 0, 1, 2, loss=0.2, metrics={"acc": 2}),
        before_0015=True,
    )
    write(before_0012, shard(2, 0, 0, 3, loss=1.5), before_0015=True)
    write(before_0012, shard(3, 0, 0, 2, loss=7.0), shard(3, 1, 1, 2, loss=0.5), before_0015=True)
    with psycopg.connect(before_0012) as conn:
        old = conn.execute(
            "SELECT step, run_attempt, value, shards_valued FROM ckpt_checkpoint_values(%s, %s)"
            " ORDER BY step",
            ("job-v", "loss"),
        ).fetchall()
    # WHEN 0012 is applied THEN every checkpoint's value is what 0009 computed from its shards,
    # and a report written after it adds to the backfilled part
    with connect_url(before_0012) as conn:
        assert apply_migrations(conn)[0] == "0012_checkpoint_values.sql"  # and any later
    assert values_not_kept(before_0012) == []
    new = values(before_0012, "loss")
    assert [int(r[0]) for r in old] == sorted(new)
    for step, attempt, value, valued in old:
        assert new[step][0] == attempt and new[step][2] == valued
        assert new[step][1] == pytest.approx(value)
    assert values(before_0012, "acc") == {1: (0, 1.5, 2)}
    write(before_0012, shard(2, 0, 1, 3, loss=2.5))
    assert values(before_0012, "loss")[2] == (0, 2.0, 2)
    assert values_not_kept(before_0012) == []


FILL = """
INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size, shards_present,
                                  is_complete, first_reported_at, completed_at, value_sums,
                                  oldest_run_attempt)
SELECT 'plan', s * 100, s, s %% 2, %(ranks)s, %(ranks)s, true, now(), now(),
       jsonb_build_object('loss', jsonb_build_array(%(ranks)s * 0.5, %(ranks)s)), s %% 2
FROM generate_series(1, %(checkpoints)s) s;
INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch, world_size, uri,
                                        loss, reported_at)
SELECT 'plan', s * 100, r, s %% 2, s, %(ranks)s, 's3://b/' || s || '/' || r, 0.5, now()
FROM generate_series(1, %(checkpoints)s) s, generate_series(0, %(ranks)s - 1) r;
-- One superseded shard row (attempt 0 of step 100, at attempt 1): restarted mid-save.
UPDATE training_checkpoint_shards SET run_attempt = 0 WHERE step = 100 AND rank = 0;
UPDATE training_checkpoints SET shards_present = %(ranks)s - 1, is_complete = false,
    oldest_run_attempt = 0,
    value_sums = jsonb_build_object('loss', jsonb_build_array((%(ranks)s - 1) * 0.5,
                                                              %(ranks)s - 1))
WHERE step = 100
"""


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_checkpoints_listing_reads_no_shard_row_of_a_current_attempt(clean_db: str) -> None:
    # GIVEN a job of 30 checkpoints x 1,000 ranks, one of them with a superseded shard row
    ranks, checkpoints = 1000, 30
    with psycopg.connect(clean_db, autocommit=True) as conn:
        for statement in FILL.split(";"):
            conn.execute(statement, {"ranks": ranks, "checkpoints": checkpoints})
        conn.execute("ANALYZE training_checkpoints, training_checkpoint_shards")
        # WHEN `checkpoints` / the prune planner read it with a value (EXPLAIN ANALYZE)
        params = {"job_id": "plan", "metric": "loss"}
        (answer,) = conn.execute(  # type: ignore[misc]
            "EXPLAIN (ANALYZE, FORMAT JSON) " + _WITH_VALUE, params
        ).fetchone()
        (count,) = conn.execute(  # type: ignore[misc]
            "EXPLAIN (ANALYZE, FORMAT JSON) " + _SUPERSEDED,
            {"job_id": "plan", "steps": [100], "attempts": [1]},
        ).fetchone()
        rows = job_checkpoints(conn, "plan", metric="loss")
    plans = [(a if isinstance(a, list) else json.loads(a))[0] for a in (answer, count)]
    # THEN the states read no shard row at all and are too cheap to be JIT-compiled; the
    # superseded count reads the one flagged checkpoint's rows by its primary key
    states = list(_nodes(plans[0]["Plan"]))
    assert not [n for n in states if n.get("Relation Name") == "training_checkpoint_shards"]
    assert "JIT" not in plans[0] and plans[0]["Plan"]["Total Cost"] < 100_000
    on_shards = [
        n
        for n in _nodes(plans[1]["Plan"])
        if n.get("Relation Name") == "training_checkpoint_shards"
    ]
    assert on_shards and all(n["Node Type"] != "Seq Scan" for n in on_shards), on_shards
    assert len(rows) == checkpoints
    first = rows[0]
    assert (first.shard_rows, first.superseded_rows, first.shards_present) == (ranks, 1, ranks - 1)
    assert all(r.superseded_rows == 0 and r.shard_rows == ranks for r in rows[1:])
    assert all(r.value == 0.5 for r in rows)
