"""Concurrent writers and arbitrary delivery orders end in the same, correct rows."""

from __future__ import annotations

import hashlib
import random
import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lambda_writer.shared.settings import WriterSettings
from lambda_writer.writer.batch import BatchResult, CheckpointWriter
from tests.lambda_writer.helpers import (
    Row,
    all_rows,
    body,
    checkpoint_rows,
    sqs_messages,
    values_not_kept,
)

Identity = tuple[str, int, int, int]  # job, step, run_attempt, rank
BASE = datetime(2026, 1, 1, tzinfo=UTC)


def world_size(attempt: int) -> int:
    # Attempt 1 ran on a smaller world: exercises the reset of a checkpoint by a newer attempt.
    return 2 if attempt == 1 else 4


def identity_body(identity: Identity) -> str:
    """The one body a given report identity always has (content is a function of identity)."""
    job, step, attempt, rank = identity
    return body(
        job_id=job,
        step=step,
        run_attempt=attempt,
        rank=rank,
        epoch=step + attempt,
        world_size=world_size(attempt),
        uri=f"s3://b/{job}/{step}/{attempt}/{rank}",
        loss=float(rank) / 10,
        metrics={"acc": rank * 0.25 + attempt / 3},
        created_at=BASE + timedelta(seconds=step * 100 + attempt * 10 + rank),
    )


def message_id(identity: Identity) -> str:
    return hashlib.sha256(repr(identity).encode()).hexdigest()[:32]


def expected_checkpoints(identities: set[Identity]) -> list[Row]:
    """What the checkpoint rows must be after all of ``identities`` were written."""
    by_key: dict[tuple[str, int], set[Identity]] = defaultdict(set)
    for ident in identities:
        by_key[(ident[0], ident[1])].add(ident)
    rows: list[Row] = []
    for (job, step), idents in sorted(by_key.items()):
        attempt = max(i[2] for i in idents)
        present = len({i[3] for i in idents if i[2] == attempt})
        ws = world_size(attempt)
        rows.append((job, step, step + attempt, attempt, ws, present, present == ws))
    return rows


@pytest.mark.slow
def test_two_writers_on_overlapping_batches_never_deadlock(clean_db: str) -> None:
    # GIVEN every report of one job over 4 steps, 2 attempts, 4 ranks
    universe = [("job-a", s, a, r) for s in range(4) for a in (0, 2) for r in range(4)]
    universe += [("job-a", s, 1, r) for s in range(4) for r in range(2)]
    writers = [CheckpointWriter(WriterSettings(database_url=clean_db)) for _ in range(2)]
    rng = random.Random(7)
    failures: list[str] = []
    written: set[Identity] = set()
    try:
        for _round in range(150):
            # WHEN two writers get overlapping batches of 10 at the same moment, delivered in
            # opposite key orders (the worst case for lock ordering)
            keys = rng.sample(universe, 14)
            batches = [sorted(keys[:10]), sorted(keys[4:], reverse=True)]
            barrier = threading.Barrier(len(writers))
            results: list[BatchResult] = []
            threads = [
                threading.Thread(target=_run, args=(w, b, barrier, results))
                for w, b in zip(writers, batches, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            for result in results:
                failures.extend(result.failed)
            for batch in batches:
                written.update(batch)
            # THEN nothing failed (a deadlock would be a transient failure) and counts are exact
            assert failures == []
            assert checkpoint_rows(clean_db) == expected_checkpoints(written)
    finally:
        for w in writers:
            w.connection.discard()


def _run(
    writer: CheckpointWriter,
    batch: list[Identity],
    barrier: threading.Barrier,
    results: list[BatchResult],
) -> None:
    messages = sqs_messages([identity_body(i) for i in batch], ids=[message_id(i) for i in batch])
    barrier.wait()
    results.append(writer.process(messages))


_identity = st.tuples(
    st.sampled_from(["job-a", "job-b"]),
    st.integers(0, 1),
    st.integers(0, 2),
    st.integers(0, 3),
).filter(lambda i: i[3] < world_size(i[2]))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    identities=st.sets(_identity, min_size=1, max_size=14),
    data=st.data(),
)
@pytest.mark.slow
def test_any_permutation_and_duplication_gives_the_rows_of_applying_once(
    clean_db: str, identities: set[Identity], data: st.DataObject
) -> None:
    writer = CheckpointWriter(WriterSettings(database_url=clean_db))
    try:
        ordered = sorted(identities)

        def apply(batches: list[list[Identity]]) -> tuple[list[Row], list[Row]]:
            with psycopg.connect(clean_db, autocommit=True) as conn:
                conn.execute("TRUNCATE training_checkpoint_shards, training_checkpoints CASCADE")
            for batch in batches:
                messages = sqs_messages(
                    [identity_body(i) for i in batch], ids=[message_id(i) for i in batch]
                )
                assert writer.process(messages).failed == []
            return all_rows(clean_db)

        # Reference: each report once, one per batch, in order.
        reference = apply([[i] for i in ordered])
        assert reference[0] == expected_checkpoints(identities)
        # Any delivery: a permutation with duplicates, cut into batches of 1..10.
        extra = data.draw(st.lists(st.sampled_from(ordered), max_size=10))
        stream = data.draw(st.permutations(ordered + extra))
        cuts: list[list[Identity]] = []
        while stream:
            size = data.draw(st.integers(1, min(10, len(stream))))
            cuts.append(list(stream[:size]))
            stream = stream[size:]
        assert apply(cuts) == reference
        # ... and the values the writer keeps are those of the shard rows (migration 0012)
        assert values_not_kept(clean_db) == []
    finally:
        writer.connection.discard()


@pytest.mark.parametrize("seed", [1, 2])
def test_shuffled_batches_match_sequential(clean_db: str, seed: int) -> None:
    universe = [("job-a", s, a, r) for s in range(3) for a in (0, 2) for r in range(4)]
    writer = CheckpointWriter(WriterSettings(database_url=clean_db))
    try:
        shuffled = random.Random(seed).sample(universe, len(universe))
        for start in range(0, len(shuffled), 10):
            batch = shuffled[start : start + 10]
            assert writer.process(sqs_messages([identity_body(i) for i in batch])).failed == []
        assert checkpoint_rows(clean_db) == expected_checkpoints(set(universe))
        assert values_not_kept(clean_db) == []
    finally:
        writer.connection.discard()
