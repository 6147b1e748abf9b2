"""The resume walk: a job's complete checkpoints, newest first, one per round trip, each with its
shard rows (from its manifest, migration 0013, or aggregated from the shard rows), as
``latest_complete_checkpoint``, the restart's decision and ``best_complete_checkpoint`` read
them."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from trainer_client.restart.shard_rows import (
    MANIFEST_CHUNKS,
    MANIFEST_COLUMNS,
    SHARD_AGGREGATES,
    SHARD_AGGREGATES_OF,
    SHARD_ROWS,
    ShardRows,
)
from trainer_client.storage.verify import ShardRecord

_log = logging.getLogger(__name__)

_BIGINT_MAX = 2**63 - 1

# The job's newest complete checkpoint older than %(before)s and its shard rows, in one round
# trip: the checkpoint is one probe of the partial index training_checkpoints_latest_complete_idx
# (complete_checkpoints, migration 0010, is the one definition of "complete", so with no bound
# this is the checkpoint latest_complete_checkpoints names), its shard rows the few rows of its
# manifest (migration 0013: the texts of trainer_client/restart/shard_rows.py, built once by
# the settle that marked it complete), one range of the manifests' primary key. A checkpoint with
# no manifest of its attempt (completed before 0013, or a shard row changed since) comes back as
# one row of NULLs, and its shard rows are read aggregated in a second round trip (candidate()).
# One checkpoint per round trip: at 100,000 ranks a page of several would read megabytes a
# resume never verifies; older ones are read only while newer ones fail verification. The plan is
# pinned by tests/integrations/test_resume_plans.py.
_NEWEST_COMPLETE = """
WITH c AS (
    SELECT step, epoch, run_attempt, world_size
    FROM complete_checkpoints
    WHERE job_id = %(job_id)s AND step < %(before)s
    ORDER BY step DESC
    LIMIT 1
)
"""
_LATEST_COMPLETE = (
    _NEWEST_COMPLETE
    + f"SELECT c.step, c.epoch, c.run_attempt, c.world_size, {MANIFEST_COLUMNS}\nFROM c"
    + MANIFEST_CHUNKS
)
# The same checkpoint with its shard rows aggregated into its one row, in one round trip: the
# walk of a database before 0013, or of a role that may not read the manifests (a resuming job's
# role made with SELECT on complete_checkpoints and the shard rows only, as before 0013).
_LATEST_AGGREGATED = (
    _NEWEST_COMPLETE + "SELECT c.step, c.epoch, c.run_attempt, c.world_size, a.*\nFROM c"
) + SHARD_AGGREGATES
# Whether this connection may read the manifests (false, not an error, before 0013).
_READS_MANIFESTS = (
    "SELECT coalesce(has_table_privilege(to_regclass('training_checkpoint_manifests'),"
    " 'SELECT'), false)"
)


# (step, epoch, run_attempt, world_size, shard rows by rank) of one complete checkpoint.
Candidate = tuple[int, int, int, int, Mapping[int, ShardRecord]]


def reads_manifests(conn: Any) -> bool:
    """Whether ``conn`` may read the checkpoint manifests (migration 0013); where it may not,
    the walks read the shard rows aggregated, as before 0013, with one log line."""
    (readable,) = conn.execute(_READS_MANIFESTS).fetchone()
    if not readable:
        _log.info(
            "training_checkpoint_manifests is not readable (not migrated to 0013, or no SELECT"
            " on it): reading the shard rows, slower at many ranks"
        )
    return bool(readable)


def candidate(conn: Any, job_id: str, rows: list[tuple[Any, ...]], *, manifest: bool) -> Candidate:
    """A candidate from the rows of (step, epoch, run_attempt, world_size, *MANIFEST_COLUMNS) of
    one checkpoint (``manifest``), or from its one row of (step, epoch, run_attempt, world_size,
    *SHARD_AGGREGATES): its shard rows from its manifest or those aggregates, decoded when first
    read; where it has no manifest, read aggregated from the shard rows; and one per row where
    the texts cannot carry them (:mod:`trainer_client.restart.shard_rows`)."""
    step, epoch, attempt, world = rows[0][:4]
    key = {"job_id": job_id, "step": step, "run_attempt": attempt}
    shards: ShardRows | None
    if manifest:
        shards = ShardRows.from_chunks([row[4:] for row in rows])
        if shards is None:
            shards = ShardRows(conn.execute(SHARD_AGGREGATES_OF, key).fetchone())
    else:
        shards = ShardRows(rows[0][4:])
    if not shards.plain:
        shards = ShardRows.from_rows(conn.execute(SHARD_ROWS, key).fetchall())
    return step, epoch, attempt, world, shards


def complete_checkpoints(conn: Any, job_id: str) -> Iterator[Candidate]:
    """Each complete checkpoint, newest first, one per round trip (``_LATEST_COMPLETE``): the
    walk of every resume (latest, the collective restart)."""
    before = _BIGINT_MAX
    manifest = reads_manifests(conn)
    walk = _LATEST_COMPLETE if manifest else _LATEST_AGGREGATED
    while True:
        rows = conn.execute(walk, {"job_id": job_id, "before": before}).fetchall()
        if not rows:
            return
        found = candidate(conn, job_id, rows, manifest=manifest)
        yield found
        before = found[0]
