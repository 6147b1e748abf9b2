"""A pruned checkpoint stays pruned: the writer drops reports its tombstone covers, in its count
statement, and a prune and a writer of one checkpoint never both win (migration 0009;
docs/DESIGN.md, "Retention: tombstones").

Forced interleavings as in ``test_interleavings``: writer A stops at an exact point on an advisory
lock the test holds; the prune is the test's own transaction (or a thread) on a third connection;
who waits for whom is read from ``pg_stat_activity``, never from a sleep.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lambda_writer.shared.connection import connect_url
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.repository import WriteOutcome, write_batch
from lambda_writer.writer.sql import write_params
from tests.lambda_writer.helpers import checkpoint_rows
from tests.lambda_writer.test_concurrency import Identity, expected_checkpoints, world_size
from tests.lambda_writer.test_interleavings import (
    KEY_A,
    SETTLE_S,
    Control,
    Writer,
    ranks,
    reports,
    write_sequentially,
)
from tests.lambda_writer.test_interleavings import paused_db as paused_db


def state(url: str, step: int = 0) -> tuple[object, ...] | None:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT run_attempt, shards_present, is_complete FROM training_checkpoint_progress"
            " WHERE job_id = 'job-a' AND step = %s",
            (step,),
        ).fetchone()


def shard_rows(url: str, step: int = 0) -> list[tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT rank, run_attempt FROM training_checkpoint_shards"
            " WHERE job_id = 'job-a' AND step = %s ORDER BY rank",
            (step,),
        ).fetchall()
    return [(int(r), int(a)) for r, a in rows]


def tombstone(url: str, step: int = 0) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT min_run_attempt FROM training_checkpoint_tombstones"
            " WHERE job_id = 'job-a' AND step = %s",
            (step,),
        ).fetchone()
    return None if row is None else int(row[0])


def prune_statements(conn: psycopg.Connection[Any], step: int, attempt: int) -> list[object]:
    """The prune's statements for one checkpoint as the executor runs them, uncommitted."""
    row = conn.execute(
        "SELECT world_size, is_complete FROM training_checkpoints"
        " WHERE job_id = 'job-a' AND step = %s",
        (step,),
    ).fetchone()
    world, complete = (4, True) if row is None else row
    wanted = json.dumps(
        [{"step": step, "run_attempt": attempt, "world_size": world, "is_complete": complete}]
    )
    conn.execute("SELECT ckpt_lock_checkpoints_for_prune('job-a', %s::bigint[])", ([step],))
    return conn.execute(
        "SELECT step, run_attempt, shard_rows FROM ckpt_remove_checkpoints('job-a', %s::json)",
        (wanted,),
    ).fetchall()


def prune(url: str, step: int = 0, attempt: int = 0) -> list[object]:
    with psycopg.connect(url) as conn:
        removed = prune_statements(conn, step, attempt)
    return removed


@pytest.fixture
def url(clean_db: str) -> Iterator[str]:
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute("TRUNCATE training_checkpoint_tombstones")
    yield clean_db


def test_a_late_report_of_a_pruned_checkpoint_recreates_nothing(url: str) -> None:
    # GIVEN a complete checkpoint, pruned
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    assert prune(url) == [(0, 0, 4)]
    assert tombstone(url) == 1
    # WHEN every one of its reports is delivered again (late, replayed, re-driven)
    with connect_url(url, autocommit=True) as conn:
        outcome = write_batch(conn, plan_batch(reports(ranks(0, 0, 1, 2, 3))))
    # THEN nothing is written: no checkpoint row, no shard row
    assert outcome == WriteOutcome(4, 0, 0)
    assert state(url) is None and shard_rows(url) == []


def test_a_new_attempt_at_a_pruned_step_is_a_new_checkpoint(url: str) -> None:
    # GIVEN a pruned checkpoint of attempt 0; WHEN attempt 2 (a job rolled back) saves that step
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    prune(url)
    write_sequentially(url, ranks(0, 0, 1) + ranks(2, 0, 1, 2, 3))
    # THEN attempt 2 is written and counted as usual; attempt 0's reports stay out
    assert state(url) == (2, 4, True)
    assert shard_rows(url) == [(0, 2), (1, 2), (2, 2), (3, 2)]


def test_a_writer_that_holds_the_lock_first_is_waited_for_and_pruned(paused_db: str) -> None:
    # GIVEN checkpoint 0 has 3 of its 4 shards (an abandoned partial); writer A writes the
    # fourth and stops before its commit, holding the checkpoint's lock shared
    with psycopg.connect(paused_db, autocommit=True) as conn:
        conn.execute("TRUNCATE training_checkpoint_tombstones")
    write_sequentially(paused_db, ranks(0, 0, 1, 2))
    control = Control(paused_db)
    writer = Writer(paused_db, "before_commit", KEY_A)
    removed: list[object] = []
    try:
        writer.start(ranks(0, 3))
        assert control.settle(writer) == "advisory"
        # WHEN the prune of that checkpoint starts: it waits for A's commit
        pruner = psycopg.connect(paused_db)
        thread = threading.Thread(target=lambda: removed.extend(prune_statements(pruner, 0, 0)))
        thread.start()
        assert _wait_for_lock(control, pruner.info.backend_pid) == "advisory"
        control.release(KEY_A)
        # (A's settle, after its commit, queues behind the prune's lock: the prune first)
        thread.join(SETTLE_S)
        pruner.commit()
        pruner.close()
        writer.join()
        # THEN the prune saw A's committed shard and removed it with the others (A's settle,
        # queued behind the prune, found no row to settle)
        assert writer.error is None
        assert removed == [(0, 0, 4)]
        assert state(paused_db) is None and shard_rows(paused_db) == []
    finally:
        writer.close()
        control.close()


def test_a_writer_after_the_prune_took_the_lock_waits_and_writes_nothing(url: str) -> None:
    # GIVEN checkpoint 0 complete, and the prune's transaction holding its lock, uncommitted
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    control = Control(url)
    writer = Writer(url)
    pruner = psycopg.connect(url)
    try:
        assert prune_statements(pruner, 0, 0) == [(0, 0, 4)]
        # WHEN a late report of it arrives: the writer waits for the prune's commit
        writer.start(ranks(0, 2))
        assert control.settle(writer) == "advisory"
        pruner.commit()
        writer.join()
        # THEN its count statement saw the tombstone: nothing re-created
        assert writer.error is None and writer.outcome == WriteOutcome(1, 0, 0)
        assert state(url) is None and shard_rows(url) == []
    finally:
        pruner.close()
        writer.close()
        control.close()


def test_a_writer_inside_its_own_transaction_waits_for_the_prune_too(url: str) -> None:
    # GIVEN the prune holds checkpoint 0's lock, uncommitted
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    control = Control(url)
    writer = Writer(url)
    pruner = psycopg.connect(url)
    outcome: list[object] = []
    try:
        prune_statements(pruner, 0, 0)
        # WHEN the previous release's function (the caller's own transaction) writes a replay
        plan = plan_batch(reports(ranks(0, 1)))
        writer.thread = threading.Thread(
            target=lambda: outcome.append(
                writer.conn.execute(
                    "SELECT * FROM ckpt_write_batch_json(%s::json, %s::json)", write_params(plan)
                ).fetchone()
            )
        )
        writer.thread.start()
        assert control.settle(writer) == "advisory"
        pruner.commit()
        writer.join()
        # THEN it counted nothing and re-created nothing
        assert outcome == [(0, 0)]
        assert state(url) is None
    finally:
        pruner.close()
        writer.close()
        control.close()


def test_a_prune_of_a_checkpoint_that_moved_to_a_newer_attempt_removes_nothing(url: str) -> None:
    # GIVEN the plan saw attempt 0 complete, and attempt 2 has since started at that step
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    write_sequentially(url, ranks(2, 0))
    # WHEN the prune runs with what it planned
    # THEN the row is not what the plan saw: nothing removed, no tombstone
    assert prune(url, 0, 0) == []
    assert state(url) == (2, 1, False) and tombstone(url) is None


def test_superseded_shard_rows_stay_pruned(url: str) -> None:
    # GIVEN attempt 0 wrote ranks 0-3, attempt 2 (world 4) rewrote ranks 0-2 only: rank 3 of
    # attempt 0 is superseded
    write_sequentially(url, ranks(0, 0, 1, 2, 3) + ranks(2, 0, 1, 2))
    assert shard_rows(url) == [(0, 2), (1, 2), (2, 2), (3, 0)]
    # WHEN the superseded rows are pruned
    with psycopg.connect(url) as conn:
        conn.execute("SELECT ckpt_lock_checkpoints_for_prune('job-a', ARRAY[0]::bigint[])")
        removed = conn.execute(
            "SELECT * FROM ckpt_remove_superseded('job-a', %s::json)",
            (json.dumps([{"step": 0, "run_attempt": 2}]),),
        ).fetchall()
    assert removed == [(0, 2, 1)]
    # THEN a replay of attempt 0's rank 3 stays out, attempt 2's rank 3 completes the checkpoint
    write_sequentially(url, ranks(0, 3))
    assert shard_rows(url) == [(0, 2), (1, 2), (2, 2)]
    write_sequentially(url, ranks(2, 3))
    assert state(url) == (2, 4, True)


def _wait_for_lock(control: Control, pid: int) -> str:
    import time

    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        event = control.waiting_on(pid)
        if event is not None:
            return event
        time.sleep(0.005)  # polling a condition, not waiting for a duration
    raise AssertionError(f"backend {pid} never waited for a lock")


_identity = st.tuples(
    st.just("job-a"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)
).filter(lambda i: i[3] < world_size(i[2]))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=st.lists(_identity, max_size=8),
    after=st.lists(_identity, max_size=8),
    pruned=st.sampled_from([0, 1]),
)
def test_after_a_prune_the_rows_are_those_of_the_admitted_reports(
    url: str, before: list[Identity], after: list[Identity], pruned: int
) -> None:
    # GIVEN some reports, then a prune of one step (whatever its state), then more reports,
    # some of them replays of the first ones
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE training_checkpoint_shards, training_checkpoints,"
            " training_checkpoint_tombstones CASCADE"
        )
    write_sequentially(url, before)
    attempt = max((i[2] for i in before if i[1] == pruned), default=None)
    if attempt is not None:
        assert len(prune(url, pruned, attempt)) == 1
    for identity in after:
        write_sequentially(url, [identity])
    # THEN every checkpoint is that of the reports the tombstone admits, nothing else
    admitted = {
        i
        for i in [*before, *after]
        if attempt is None or i[1] != pruned or (i in after and i[2] > attempt)
    }
    assert checkpoint_rows(url) == expected_checkpoints(admitted)


def test_the_writer_logs_a_tombstoned_report_as_dropped_not_written(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from lambda_writer import WriterSettings
    from lambda_writer.writer.batch import CheckpointWriter

    # GIVEN step 0 pruned, and step 1 new
    write_sequentially(url, ranks(0, 0, 1, 2, 3))
    assert prune(url) == [(0, 0, 4)]
    writer = CheckpointWriter(
        WriterSettings(database_url=url), logger=logging.getLogger("test.writer")
    )
    # WHEN a late report of step 0 and a report of step 1 arrive in one batch
    batch = [item.message for item in reports([*ranks(0, 1), *ranks(0, 0, step=1)])]
    with caplog.at_level(logging.INFO, logger="test.writer"):
        result = writer.process(batch)
    writer.connection.discard()
    # THEN step 0's is logged as dropped on the tombstone, step 1's as written
    assert result.failed == [] and result.rows_changed == 1
    lines = [(r.message, getattr(r, "step", None)) for r in caplog.records]
    assert ("record dropped: the checkpoint was pruned (tombstone)", 0) in lines
    assert ("record written", 1) in lines
    assert ("record written", 0) not in lines
