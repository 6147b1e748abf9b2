"""Forced interleavings of two real writers: the slot count loses and doubles nothing.

Migration 0006 adds each batch's exact delta to a count row of the writing backend, writes the
checkpoint row only when the batch raises it, and settles completeness after the batch's commit
(docs/DESIGN.md, "The writer: counting shards in slot rows"). Random concurrency rarely hits
the dangerous windows, so these tests stop writer A at an exact point inside its batch and let
writer B run as far as it can before A goes on:

* ``before_count``: A's shard rows are written (and locked, uncommitted), and its checkpoint rows
  if it raised them; its count rows are not;
* ``before_commit``: A's count rows are written too, A has not committed (nor settled).

The stop is a test-only trigger on ``training_checkpoint_counts`` that waits for an advisory lock
the test holds, only in sessions whose ``ckpt_test.pause_at`` names it; the test sees a writer
stopped (or blocked behind the other) in ``pg_stat_activity``, never by sleeping for a time. A
batch that moves no shard writes no count row and so does not stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lambda_writer.shared.connection import Connection, connect_url
from lambda_writer.shared.exceptions import TransientWriteError
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import ValidReport, classify
from lambda_writer.writer.repository import WriteOutcome, write_batch
from lambda_writer.writer.sql import write_params
from tests.lambda_writer.helpers import checkpoint_rows, sqs_messages, values_not_kept
from tests.lambda_writer.test_concurrency import (
    Identity,
    expected_checkpoints,
    identity_body,
    message_id,
    world_size,
)

KEY_A, KEY_B = 0x636B7074_0000_000A, 0x636B7074_0000_000B
SETTLE_S = 60  # generous bound for a stuck test; nothing is asserted about durations

PAUSE_TRIGGERS = """
CREATE FUNCTION ckpt_test_pause() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted text := current_setting('ckpt_test.pause_at', true);
BEGIN
    IF wanted IS NOT NULL AND split_part(wanted, ':', 1) = TG_ARGV[0] THEN
        -- Waits while the test holds this key; once granted it stays held (re-entrant) until
        -- this transaction ends, so later rows of the same statement do not stop again.
        PERFORM pg_advisory_xact_lock(split_part(wanted, ':', 2)::bigint);
    END IF;
    RETURN NEW;
END $$;
-- BEFORE INSERT fires for every row proposed to INSERT … ON CONFLICT, before the conflict check
-- takes the row lock; the shard rows and any raised checkpoint row are written by then.
CREATE TRIGGER ckpt_test_before_count BEFORE INSERT ON training_checkpoint_counts
    FOR EACH ROW EXECUTE FUNCTION ckpt_test_pause('before_count');
-- AFTER row triggers fire at the end of the statement: the count rows are locked, and the
-- batch's first transaction has not committed.
CREATE TRIGGER ckpt_test_before_commit AFTER INSERT OR UPDATE ON training_checkpoint_counts
    FOR EACH ROW EXECUTE FUNCTION ckpt_test_pause('before_commit');
"""
DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS ckpt_test_before_count ON training_checkpoint_counts;
DROP TRIGGER IF EXISTS ckpt_test_before_commit ON training_checkpoint_counts;
DROP FUNCTION IF EXISTS ckpt_test_pause();
"""


@pytest.fixture
def paused_db(clean_db: str) -> Iterator[str]:
    """The clean database with the pause triggers (inert in sessions that do not ask)."""
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(DROP_TRIGGERS)
        conn.execute(PAUSE_TRIGGERS)
    yield clean_db
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(DROP_TRIGGERS)


def reports(identities: list[Identity]) -> list[ValidReport]:
    bodies = [identity_body(i) for i in identities]
    out = []
    for message in sqs_messages(bodies, ids=[message_id(i) for i in identities]):
        item = classify(message)
        assert isinstance(item, ValidReport)
        out.append(item)
    return out


@dataclass
class Writer:
    """One writer connection in its own thread, stopping at ``pause`` (if any) until released."""

    url: str
    pause: str | None = None
    key: int = 0
    conn: Connection = field(init=False)
    outcome: WriteOutcome | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.conn = connect_url(self.url, autocommit=True)
        if self.pause is not None:
            # Session state is fine here: a test connection, never the writer's own.
            self.conn.execute(
                "SELECT set_config('ckpt_test.pause_at', %s, false)", (f"{self.pause}:{self.key}",)
            )

    @property
    def pid(self) -> int:
        return int(self.conn.info.backend_pid)

    def start(self, identities: list[Identity]) -> None:
        plan = plan_batch(reports(identities))

        def run() -> None:
            try:
                self.outcome = write_batch(self.conn, plan)
            except BaseException as exc:  # re-raised by the test through .error
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    @property
    def done(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(SETTLE_S)
        assert not self.thread.is_alive(), "writer did not finish"

    def close(self) -> None:
        self.conn.close()


class Control:
    """The test's own connection: holds the pause keys and watches the writers' backends."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        for key in (KEY_A, KEY_B):
            self.conn.execute("SELECT pg_advisory_lock(%s)", (key,))

    def release(self, key: int) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def waiting_on(self, pid: int) -> str | None:
        """The lock ``pid`` waits for (advisory, transactionid, tuple…), or None."""
        row = self.conn.execute(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            (pid,),
        ).fetchone()
        return None if row is None else str(row[0])

    def settle(self, writer: Writer) -> str:
        """Wait until ``writer`` finished or waits for a lock; returns 'done' or the lock."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            if writer.done:
                return "done"
            event = self.waiting_on(writer.pid)
            if event is not None:
                return event
            time.sleep(0.005)  # polling a condition, not waiting for a duration
        raise AssertionError(f"writer {writer.pid} neither finished nor waits for a lock")

    def close(self) -> None:
        self.conn.close()


def write_sequentially(url: str, identities: list[Identity]) -> None:
    if identities:
        with connect_url(url, autocommit=True) as conn:
            write_batch(conn, plan_batch(reports(identities)))


def present(url: str, step: int = 0) -> tuple[int, int, bool]:
    """(run_attempt, shards_present, is_complete) of job-a's checkpoint at ``step``."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT run_attempt, shards_present, is_complete FROM training_checkpoint_progress"
            " WHERE job_id = 'job-a' AND step = %s",
            (step,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), bool(row[2])


def interleave(
    url: str,
    a: list[Identity],
    b: list[Identity],
    *,
    a_at: str,
    b_at: str | None = None,
    release_b_first: bool = False,
) -> tuple[Writer, Writer, str]:
    """Stop A at ``a_at``; run B (stopping at ``b_at``) as far as it gets; release; join both.

    Returns the writers and where B stood while A was stopped ('done', 'advisory' = at its own
    stop, or the lock it waited for behind A).
    """
    control = Control(url)
    wa, wb = Writer(url, a_at, KEY_A), Writer(url, b_at, KEY_B)
    try:
        wa.start(a)
        assert control.settle(wa) in {"advisory", "done"}
        wb.start(b)
        b_state = control.settle(wb)
        for key, writer in ((KEY_B, wb), (KEY_A, wa)) if release_b_first else ((KEY_A, wa),):
            control.release(key)
            control.settle(writer)
        if not release_b_first:
            control.release(KEY_B)
        wa.join()
        wb.join()
        for w in (wa, wb):
            if w.error is not None:
                raise w.error
        # Claim 1 for the values (migration 0012): at every snapshot, kept = the shard rows'
        assert values_not_kept(url) == []
        return wa, wb, b_state
    finally:
        for w in (wa, wb):
            w.close()
        control.close()


def ranks(attempt: int, *rs: int, step: int = 0) -> list[Identity]:
    return [("job-a", step, attempt, r) for r in rs]


def test_writers_of_an_existing_checkpoint_do_not_wait_for_each_other(paused_db: str) -> None:
    # GIVEN the checkpoint exists (rank 0); A wrote rank 1 and stopped before its count
    write_sequentially(paused_db, ranks(0, 0))
    # WHEN B writes ranks 2,3 of the same attempt and commits first
    wa, wb, b_state = interleave(paused_db, ranks(0, 1), ranks(0, 2, 3), a_at="before_count")
    # THEN B did not wait (no row both lock), and A's count adds to B's: complete
    assert b_state == "done"
    assert present(paused_db) == (0, 4, True)
    # (A settled the checkpoint after its commit, B could not: it saw 3 of 4)
    assert (wa.outcome, wb.outcome) == (WriteOutcome(1, 1, 1), WriteOutcome(2, 2, 0))


def test_the_last_writer_to_commit_settles_the_checkpoint(paused_db: str) -> None:
    # GIVEN the checkpoint exists (rank 0); A counted rank 1 and holds its count row, uncommitted
    write_sequentially(paused_db, ranks(0, 0))
    # WHEN B writes ranks 2,3 and settles while A's count is invisible to it
    wa, wb, b_state = interleave(paused_db, ranks(0, 1), ranks(0, 2, 3), a_at="before_commit")
    # THEN B did not wait and did not settle (3 of 4); A, committing last, settled it
    assert b_state == "done"
    assert wb.outcome == WriteOutcome(2, 2, 0) and wa.outcome == WriteOutcome(1, 1, 1)
    assert present(paused_db) == (0, 4, True)


def test_two_first_writers_of_a_new_checkpoint(paused_db: str) -> None:
    # GIVEN A inserted the checkpoint row (uncommitted); WHEN B's insert of it conflicts
    _, _, b_state = interleave(paused_db, ranks(0, 0, 1), ranks(0, 2), a_at="before_commit")
    # THEN B waited for A, then counted in its own row: 3, not 1
    assert b_state == "transactionid"
    assert present(paused_db) == (0, 3, False)


def test_a_batch_committed_but_not_settled_is_settled_by_its_redelivery(clean_db: str) -> None:
    # GIVEN the batch that completes the checkpoint committed its count, and the connection
    # dropped before the settle (phase 1 alone, as the procedure runs it before its COMMIT)
    write_sequentially(clean_db, ranks(0, 0, 1))
    plan = plan_batch(reports(ranks(0, 2, 3)))
    with connect_url(clean_db, autocommit=True) as conn:
        conn.execute("SELECT * FROM ckpt_count_batch(%s::json, %s::json)", write_params(plan))
    # THEN every shard is counted, but the checkpoint is not marked complete
    assert present(clean_db) == (0, 4, False)
    # WHEN the records are redelivered (the writer reported them for retry)
    write_sequentially(clean_db, ranks(0, 2, 3))
    # THEN the redelivery counts nothing and settles the checkpoint
    assert present(clean_db) == (0, 4, True)


def test_previous_release_writer_and_this_one_on_one_checkpoint(paused_db: str) -> None:
    # GIVEN the checkpoint exists (rank 0); A runs the previous release's statement (0005's
    # function, whose body 0006 replaced) and stopped with its count written, uncommitted
    write_sequentially(paused_db, ranks(0, 0))
    control = Control(paused_db)
    wa, wb = Writer(paused_db, "before_commit", KEY_A), Writer(paused_db)
    try:
        plan = plan_batch(reports(ranks(0, 1)))
        thread = threading.Thread(
            target=lambda: wa.conn.execute(
                "SELECT * FROM ckpt_write_batch_json(%s::json, %s::json)", write_params(plan)
            )
        )
        wa.thread = thread
        thread.start()
        assert control.settle(wa) == "advisory"
        # WHEN B (this release) writes ranks 2,3: it waits for A's lock before it counts
        # (0007; under 0006 its count committed and its settle waited)
        wb.start(ranks(0, 2, 3))
        assert control.settle(wb) == "advisory"
        control.release(KEY_A)
        wa.join()
        wb.join()
        assert wb.error is None
        # THEN whoever settled saw all four: complete
        assert present(paused_db) == (0, 4, True)
    finally:
        for w in (wa, wb):
            w.close()
        control.close()


def test_this_release_first_then_a_writer_inside_its_own_transaction(paused_db: str) -> None:
    # GIVEN the checkpoint exists (rank 0); B (this release) counted ranks 2,3 and stopped before
    # its commit, holding the checkpoint's lock shared since before its count (0007)
    write_sequentially(paused_db, ranks(0, 0))
    control = Control(paused_db)
    wa, wb = Writer(paused_db), Writer(paused_db, "before_commit", KEY_B)
    try:
        wb.start(ranks(0, 2, 3))
        assert control.settle(wb) == "advisory"
        # WHEN A, inside its own transaction (ckpt_write_batch_json), writes rank 1
        plan = plan_batch(reports(ranks(0, 1)))
        outcome: list[object] = []
        wa.thread = threading.Thread(
            target=lambda: outcome.append(
                wa.conn.execute(
                    "SELECT * FROM ckpt_write_batch_json(%s::json, %s::json)", write_params(plan)
                ).fetchone()
            )
        )
        wa.thread.start()
        # THEN A waits for B's commit before it counts, so A's settle sees B's shards
        assert control.settle(wa) == "advisory"
        control.release(KEY_B)
        wa.join()
        wb.join()
        assert wb.error is None and wb.outcome == WriteOutcome(2, 2, 0)
        assert outcome == [(1, 1)]  # A counted rank 1 and settled the checkpoint
        assert present(paused_db) == (0, 4, True)
    finally:
        for w in (wa, wb):
            w.close()
        control.close()


def test_replay_racing_its_original_is_counted_once(paused_db: str) -> None:
    # GIVEN A wrote ranks 0,1 (uncommitted); WHEN B replays rank 1 and adds rank 2
    _, wb, b_state = interleave(paused_db, ranks(0, 0, 1), ranks(0, 1, 2), a_at="before_count")
    # THEN B waited on A's shard row, found rank 1 stored, and counted rank 2 only
    assert b_state == "transactionid"
    assert wb.outcome == WriteOutcome(2, 1, 0)  # A's row already holds B's values
    assert present(paused_db) == (0, 3, False)


def test_newer_attempt_overtakes_an_uncounted_older_one(paused_db: str) -> None:
    # GIVEN A (attempt 0) wrote ranks 0,1 and stopped before counting
    # WHEN B (attempt 2, world 4) writes ranks 2,3 and commits first
    interleave(paused_db, ranks(0, 0, 1), ranks(2, 2, 3), a_at="before_count")
    # THEN A's stale shards are stored but never counted for attempt 2
    assert present(paused_db) == (2, 2, False)
    write_sequentially(paused_db, ranks(2, 0, 1))
    assert present(paused_db) == (2, 4, True)


def test_stale_attempt_completes_then_newer_attempt_resets(paused_db: str) -> None:
    # GIVEN attempt 0 has ranks 0-2; A (attempt 2) moved ranks 0,1 to attempt 2, uncommitted
    write_sequentially(paused_db, ranks(0, 0, 1, 2))
    # WHEN B (attempt 0) adds rank 3 and commits first: attempt 0 is complete for a moment, and
    # B's settle of it waits for A's raise of the row to attempt 2
    wa, _, b_state = interleave(paused_db, ranks(2, 0, 1), ranks(0, 3), a_at="before_count")
    assert b_state == "transactionid"
    # THEN A's newer attempt restarts the count at its own 2 moved shards
    assert wa.outcome == WriteOutcome(2, 2, 1)
    assert present(paused_db) == (2, 2, False)
    assert checkpoint_rows(paused_db) == expected_checkpoints(
        set(ranks(0, 0, 1, 2, 3)) | set(ranks(2, 0, 1))
    )


def test_older_attempt_waiting_on_a_newer_shard_counts_nothing(paused_db: str) -> None:
    # GIVEN A (attempt 2) wrote rank 0, uncommitted; WHEN B (attempt 0) writes rank 0 and 1
    _, wb, b_state = interleave(paused_db, ranks(2, 0), ranks(0, 0, 1), a_at="before_count")
    # THEN B waited, did not overwrite rank 0, stored its rank 1 uncounted
    assert b_state == "transactionid"
    assert wb.outcome == WriteOutcome(2, 1, 1)  # 1 row: its earlier first_reported_at
    assert present(paused_db) == (2, 1, False)


def test_rolled_back_writer_counts_nothing_until_retried(paused_db: str) -> None:
    # GIVEN A wrote ranks 0,1 and stopped before counting
    control = Control(paused_db)
    wa, wb = Writer(paused_db, "before_count", KEY_A), Writer(paused_db)
    try:
        wa.start(ranks(0, 0, 1))
        assert control.settle(wa) == "advisory"
        # WHEN B writes ranks 2,3 (waiting for A's insert of the checkpoint row) and A's backend
        # dies (its transaction rolls back)
        wb.start(ranks(0, 2, 3))
        assert control.settle(wb) == "transactionid"
        control.conn.execute("SELECT pg_terminate_backend(%s)", (wa.pid,))
        wa.join()
        wb.join()
        assert wb.error is None
        assert isinstance(wa.error, TransientWriteError)
        # THEN only B's shards count; the redelivered batch then counts once
        assert present(paused_db) == (0, 2, False)
        write_sequentially(paused_db, ranks(0, 0, 1))
        assert present(paused_db) == (0, 4, True)
    finally:
        for w in (wa, wb):
            w.close()
        control.close()


_identity = st.tuples(
    st.just("job-a"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)
).filter(lambda i: i[3] < world_size(i[2]))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=st.lists(_identity, max_size=6),
    a=st.lists(_identity, min_size=1, max_size=6),
    b=st.lists(_identity, min_size=1, max_size=6),
    a_at=st.sampled_from(["before_count", "before_commit"]),
    b_at=st.sampled_from([None, "before_count", "before_commit"]),
    release_b_first=st.booleans(),
)
@pytest.mark.slow
def test_any_forced_interleaving_gives_the_counts_of_the_union(
    paused_db: str,
    before: list[Identity],
    a: list[Identity],
    b: list[Identity],
    a_at: str,
    b_at: str | None,
    release_b_first: bool,
) -> None:
    # GIVEN some stored reports; WHEN two overlapping batches are written with A stopped at a
    # point and B run as far as it gets (itself stopped or not, released before or after A)
    with psycopg.connect(paused_db, autocommit=True) as conn:
        conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")
    write_sequentially(paused_db, before)
    interleave(paused_db, a, b, a_at=a_at, b_at=b_at, release_b_first=release_b_first)
    # THEN every checkpoint's attempt, count and completeness are those of all reports applied
    assert checkpoint_rows(paused_db) == expected_checkpoints(set(before) | set(a) | set(b))
    with psycopg.connect(paused_db) as conn:
        stored = conn.execute(
            "SELECT job_id, step, rank, run_attempt FROM training_checkpoint_shards"
        ).fetchall()
    newest: dict[tuple[str, int, int], int] = {}
    for job, step, attempt, rank in [*before, *a, *b]:
        newest[(job, step, rank)] = max(attempt, newest.get((job, step, rank), -1))
    assert {(j, s, r): ra for j, s, r, ra in stored} == newest
    # ... and every checkpoint's kept values are its shard rows' (migration 0012)
    assert values_not_kept(paused_db) == []


def test_a_caller_inside_its_own_transaction_counts_and_settles(clean_db: str) -> None:
    # GIVEN a connection that is not autocommit (a procedure cannot COMMIT inside its
    # transaction, so the batch goes through ckpt_write_batch_json, 0006's body)
    write_sequentially(clean_db, ranks(0, 0, 1))
    with connect_url(clean_db) as conn:
        # WHEN the batch that completes the checkpoint is written and the caller commits
        outcome = write_batch(conn, plan_batch(reports(ranks(0, 2, 3))))
        conn.commit()
    # THEN it counted its two shards and settled the checkpoint in that transaction
    assert outcome == WriteOutcome(2, 2, 1)
    assert present(clean_db) == (0, 4, True)
