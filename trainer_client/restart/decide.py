"""What one process decides for the whole job at a restart: wait for the reports in flight to be
written, then name the newest complete checkpoint that is intact in its store.

The wait: every rank tells this process which of its reports SQS accepted during the restart's
flush (``CheckpointReporter.acknowledged``: job, step, run_attempt, rank). The writer applies a
report by storing its shard row, so the wait polls ``training_checkpoint_shards`` (two queries per
``POLL_S``, each its own transaction) until each of those (step, rank) has a row of that attempt
or a newer one (the writer keeps a newer attempt's row over an older one's) and no checkpoint of
those steps is counted whole but not yet marked complete (the writer's settle commits after its
batch), or until the deadline. At the deadline the decision is taken from what the database
holds, with one warning line naming what was missing: never a hang, and never a checkpoint that
was not verified.

Then, on the same connection, one read-only REPEATABLE READ snapshot walks the complete
checkpoints newest first through :func:`trainer_client.restart.lookup.first_verified` (the
one walk and storage check of every helper). For a checkpoint in S3, the decision carries every
object to fetch with its reported size, SHA-256 and pins, from the shard rows it was verified
against, and the local directory it was uploaded from.

Finally a listing of the checkpoint's parent prefix looks for a newer checkpoint than the one
named (a report lost with a node-local spool): one warning line naming it and the command that
reports it (``ckpt-pipeline reconcile --backfill``). It is only a warning: its objects carry no
report to verify them against.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from ckpt_contract.restart import MAX_MISSING_RANKS, MAX_REASON_CHARS, SkippedCandidate
from trainer_client.exceptions import ResumeError
from trainer_client.report.launch import Launch, new_launch_id, next_attempt
from trainer_client.restart.lookup import ResumePoint, first_verified
from trainer_client.restart.read_db import read_only_connection
from trainer_client.restart.walk import complete_checkpoints
from trainer_client.storage.committed import committed_location, newest_committed
from trainer_client.storage.restore import RemoteObject, relative_name
from trainer_client.storage.uri import CheckpointUri, spread_of
from trainer_client.storage.verify import Expected, ShardRecord, expectations, list_spread

_log = logging.getLogger(__name__)

POLL_S = 0.2
# (step, run_attempt, rank) of a report SQS accepted.
InFlight = tuple[int, int, int]

_WRITTEN = """
SELECT step, rank, max(run_attempt)
FROM training_checkpoint_shards
WHERE job_id = %(job_id)s AND step = ANY(%(steps)s)
GROUP BY step, rank
"""


@dataclass(frozen=True)
class Decision:
    """What every rank receives (in the compact form of wire_decision.py)."""

    point: ResumePoint | None
    # The objects to fetch when the checkpoint is in S3 (empty for a local one).
    objects: tuple[RemoteObject, ...] = ()
    # Where the checkpoint was uploaded from (its reports' extra.uploaded_from), if they say.
    uploaded_from: str | None = None
    error: str | None = None
    # The launch every rank reports as from now on (trainer_client/report/launch.py).
    launch: Launch | None = None
    # Every newer checkpoint passed over, and why, newest first: what the restart's line says
    # and its record keeps.
    skipped: tuple[SkippedCandidate, ...] = ()
    # The job's newest checkpoint step in the database (complete or not), if any.
    newest_step: int | None = None
    # The attempts of the restarts before this one that resumed from the same step in a row,
    # newest first (a crash loop when they are ``loop_after`` - 1 or more).
    same_step_restarts: tuple[int, ...] = ()
    # Steps resumed from that a loop made the restart step back from (opt-in).
    stepped_back_from: int | None = None
    # Reports SQS accepted at this restart that the database did not hold at the deadline.
    unwritten: tuple[InFlight, ...] = ()
    # A newer committed checkpoint in the store than the one chosen, without reports (step, where).
    store_newer: tuple[int, str] | None = None
    # How many reports ``unwritten`` stands for, when it holds only the first (the distributed
    # wait counts them over every rank, wire.py); None: all of them are in it.
    unwritten_count: int | None = None

    @property
    def unwritten_reports(self) -> int:
        """How many reports SQS accepted the database did not hold at the deadline."""
        return len(self.unwritten) if self.unwritten_count is None else self.unwritten_count


# The steps among ``steps`` whose attempt has all its shards counted but is not yet marked
# complete: a batch's shard rows and counts commit first and the settle that sets is_complete
# runs after, in a transaction of its own (migrations 0006/0007), so a reader that saw the shard
# row can still find the checkpoint incomplete for that instant. The sum is the settle's own
# (shards_present + the slot counts of the row's attempt), read from the tables that every role
# reading shard rows may read (migration 0012's grant on training_checkpoint_counts).
_SETTLING = """
SELECT c.step
FROM training_checkpoints c
WHERE c.job_id = %(job_id)s AND c.step = ANY(%(steps)s) AND NOT c.is_complete
  AND c.shards_present + coalesce((
        SELECT sum(k.shards) FROM training_checkpoint_counts k
        WHERE k.job_id = c.job_id AND k.step = c.step AND k.run_attempt = c.run_attempt
      ), 0) >= c.world_size
"""


# The newest attempt the job ever had: its launches (migration 0014), its restarts (0017: a launch
# that reported nothing) and, for rows written before launches or by a client without them, its
# checkpoint rows. A role without SELECT on the
# launches (a reader granted before 0014 on a database migrated without it) reads the rows only.
_NEWEST_ATTEMPT = """
SELECT greatest(
    (SELECT max(run_attempt) FROM training_checkpoints WHERE job_id = %(job_id)s),
    (SELECT max(run_attempt) FROM training_job_launches WHERE job_id = %(job_id)s),
    (SELECT max(run_attempt) FROM training_job_restarts WHERE job_id = %(job_id)s))
"""
_NEWEST_ATTEMPT_ROWS = "SELECT max(run_attempt) FROM training_checkpoints WHERE job_id = %(job_id)s"

# The job's checkpoints newer than the one chosen that are not complete: the live count is the
# settle's own sum (see _SETTLING); the ranks stored at the row's attempt name what is missing.
_INCOMPLETE_NEWER = """
SELECT c.step, c.run_attempt, c.world_size,
       (SELECT array_agg(s.rank ORDER BY s.rank) FROM training_checkpoint_shards s
        WHERE s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt)
FROM training_checkpoints c
WHERE c.job_id = %(job_id)s AND c.step > %(after)s AND NOT c.is_complete
ORDER BY c.step DESC
LIMIT %(limit)s
"""
# How many newer incomplete checkpoints the restart's line names, and how many missing ranks each.
_NAMED = 5


def newest_attempt(conn: Any, job_id: str) -> int | None:
    """The newest run_attempt of the job in the database, or None for a new job."""
    import psycopg

    try:
        with conn.transaction():
            row = conn.execute(_NEWEST_ATTEMPT, {"job_id": job_id}).fetchone()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable):
        row = conn.execute(_NEWEST_ATTEMPT_ROWS, {"job_id": job_id}).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def incomplete_newer(conn: Any, job_id: str, after: int | None) -> list[SkippedCandidate]:
    """The incomplete checkpoints newer than step ``after`` (all for None), newest first."""
    rows = conn.execute(
        _INCOMPLETE_NEWER,
        {"job_id": job_id, "after": -1 if after is None else after, "limit": _NAMED},
    ).fetchall()
    found = []
    for step, attempt, world, ranks in rows:
        present = set(ranks or [])
        missing = [r for r in range(world) if r not in present]
        found.append(
            SkippedCandidate(
                step=int(step),
                kind="incomplete",
                reason=f"attempt {attempt}: {len(present)} of {world} ranks reported",
                missing_ranks=missing[:MAX_MISSING_RANKS],
            )
        )
    return found


def describe_skipped(skipped: SkippedCandidate) -> str:
    """One candidate passed over, as the restart's line names it."""
    text = f"step {skipped.step}: {skipped.kind} ({skipped.reason}"
    if skipped.missing_ranks:
        text += "; missing rank " + ", ".join(map(str, skipped.missing_ranks))
        text += " …" if len(skipped.missing_ranks) == MAX_MISSING_RANKS else ""
    return text + ")"


# The job's newest step of any checkpoint row, complete or not: what steps lost count from.
_NEWEST_STEP = "SELECT max(step) FROM training_checkpoints WHERE job_id = %(job_id)s"
# The steps the job's latest restarts resumed from (migration 0017), newest launch first.
_RECENT_RESTARTS = """
SELECT run_attempt, resumed_step FROM training_job_restarts
WHERE job_id = %(job_id)s ORDER BY run_attempt DESC, restarted_at DESC LIMIT %(limit)s
"""


def restarts_from(conn: Any, job_id: str, step: int | None, limit: int) -> tuple[int, ...]:
    """The attempts of the job's latest restarts that resumed from ``step`` in a row (newest
    first, at most ``limit``); () without restart records (or the right to read them)."""
    import psycopg

    try:
        with conn.transaction():
            rows = conn.execute(_RECENT_RESTARTS, {"job_id": job_id, "limit": limit}).fetchall()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable):
        return ()
    same: list[int] = []
    for attempt, resumed in rows:
        if resumed != step:
            break
        same.append(int(attempt))
    return tuple(same)


def wait_until_written(
    conn: Any, job_id: str, in_flight: Iterable[InFlight], deadline: float
) -> list[InFlight]:
    """Poll until every report in ``in_flight`` has its row and the checkpoints they complete
    are marked complete (see :data:`_SETTLING`); returns the reports still missing or unsettled
    at the deadline."""
    missing = sorted(set(in_flight))
    while missing:
        written, settling = written_rows(conn, job_id, sorted({s for s, _, _ in missing}))
        missing = [
            (step, attempt, rank)
            for step, attempt, rank in missing
            if written.get((step, rank), -1) < attempt or step in settling
        ]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    return missing


def written_rows(
    conn: Any, job_id: str, steps: list[int]
) -> tuple[dict[tuple[int, int], int], set[int]]:
    """The newest attempt written per (step, rank) of ``steps``, and those of the steps counted
    whole but not yet marked complete (see :data:`_SETTLING`)."""
    rows = conn.execute(_WRITTEN, {"job_id": job_id, "steps": steps}).fetchall()
    written = {(int(step), int(rank)): int(attempt) for step, rank, attempt in rows}
    settling = {int(row[0]) for row in conn.execute(_SETTLING, {"job_id": job_id, "steps": steps})}
    return written, settling


# A job restarted this many times in a row from one checkpoint is in a loop (a NaN on load, an
# OOM at the first step): the restart says so, and may step back (``step_back_on_loop``).
DEFAULT_LOOP_AFTER = 3


def decide_restart(
    conn: Any,
    job_id: str,
    in_flight: Iterable[InFlight],
    deadline: float,
    *,
    check_files: bool,
    s3_client: Any,
    max_workers: int,
    launcher_attempt: int = 0,
    recorded_attempt: int | None = None,
    agreed: bool = True,
    loop_after: int = DEFAULT_LOOP_AFTER,
    step_back_on_loop: bool = False,
    resume_diverged: bool = False,
) -> Decision:
    """The job's resume decision (see the module docstring) and the launch that follows it,
    numbered above every attempt the job had (``agreed``: every rank receives this decision, so
    it carries a launch id; else each process decides alone and reports without one);
    ``conn`` is in autocommit mode. A restart that would be the ``loop_after``-th in a row from
    one checkpoint steps back to the previous intact complete one with ``step_back_on_loop``."""
    reports = sorted(set(in_flight))
    missing = wait_until_written(conn, job_id, reports, deadline)
    damaged: list[tuple[int, str]] = []
    stepped_back: int | None = None
    with conn.transaction():
        walk = complete_checkpoints(conn, job_id)
        found = first_verified(
            job_id,
            walk,
            check_files=check_files,
            s3_client=s3_client,
            max_workers=max_workers,
            skipped=damaged,
            skip_diverged=not resume_diverged,
        )
    resumed = found.point.step if found is not None else None
    same = restarts_from(conn, job_id, resumed, loop_after) if resumed is not None else ()
    if found is not None and step_back_on_loop and len(same) >= loop_after - 1:
        stepped_back = found.point.step
        with conn.transaction():
            older = (c for c in complete_checkpoints(conn, job_id) if c[0] < stepped_back)
            found = first_verified(
                job_id,
                older,
                check_files=check_files,
                s3_client=s3_client,
                max_workers=max_workers,
                skipped=damaged,
                skip_diverged=not resume_diverged,
            )
    with conn.transaction():
        after = found.point.step if found is not None else None
        incomplete = incomplete_newer(conn, job_id, after)
        row = conn.execute(_NEWEST_STEP, {"job_id": job_id}).fetchone()
    launch = Launch(
        next_attempt(launcher_attempt, recorded_attempt, newest_attempt(conn, job_id)),
        new_launch_id() if agreed else None,
        "restart",
    )
    skipped = sorted(
        [
            SkippedCandidate(
                step=step,
                kind="diverged" if why.startswith("diverged: ") else "damaged",
                reason=why.removeprefix("diverged: ")[:MAX_REASON_CHARS],
            )
            for step, why in damaged
        ]
        + incomplete,
        key=lambda c: c.step,
        reverse=True,
    )
    common: dict[str, Any] = {
        "launch": launch,
        "skipped": tuple(skipped),
        "unwritten": tuple(missing),
        "newest_step": None if row is None or row[0] is None else int(row[0]),
        "same_step_restarts": same,
        "stepped_back_from": stepped_back,
    }
    if found is None:
        return Decision(None, **common)
    decision = _with_objects(found.point, found.shards)
    known = {step for step, _ in damaged} | ({stepped_back} if stepped_back is not None else set())
    newer = _store_has_newer(found.point, s3_client, known, _spread_width(decision), max_workers)
    return replace(decision, store_newer=newer, **common)


def _with_objects(point: ResumePoint, shards: Mapping[int, ShardRecord]) -> Decision:
    if CheckpointUri.parse(point.path).scheme != "s3":
        return Decision(point)
    # Ranks that report one file (Lightning's DDP save) each pin it from their own HEAD, and
    # only the writer hashed it: one object to fetch, with every digest a rank gives.
    by_uri: dict[str, RemoteObject] = {}
    for expected in expectations(shards.values()):
        remote = _remote(point.path, expected)
        seen = by_uri.setdefault(remote.uri, remote)
        digests = {seen.sha256, remote.sha256} - {None}
        if seen.bytes != remote.bytes or len(digests) > 1:
            raise ResumeError(
                "objects", f"{remote.uri}: the ranks' reports give different sizes or SHA-256s"
            )
        if seen.sha256 is None and remote.sha256 is not None:
            by_uri[remote.uri] = remote
    objects = tuple(by_uri.values())
    origin = None
    for rank in sorted(shards):
        value = shards[rank].extra.get("uploaded_from")
        if isinstance(value, str) and value.startswith("file://"):
            origin = CheckpointUri.parse(value).decoded_path
            break
    return Decision(point, objects, origin)


def _remote(root: str, expected: Expected) -> RemoteObject:
    if expected.directory or expected.bytes is None:
        raise ResumeError(
            "objects", f"{expected.uri}: its report gives no size; it cannot be restored verified"
        )
    pin = expected.pin
    return RemoteObject(
        uri=expected.uri,
        relative=relative_name(root, expected.uri),
        bytes=expected.bytes,
        sha256=expected.sha256,
        version_id=pin.version_id if pin else None,
        etag=pin.etag if pin else None,
    )


def newer_in_listing(point: ResumePoint, relatives: Iterable[str]) -> tuple[int, str] | None:
    """The newest committed checkpoint (step, location) in a listing of the checkpoint's parent
    prefix (paths relative to it) that is newer than ``point``, or None (pure)."""
    return newest_committed(relatives, above=point.step)


def _spread_width(decision: Decision) -> int:
    """The hex digits of the spread the resume point's objects were uploaded with (0: none)."""
    root = CheckpointUri.parse(decision.point.path).key if decision.point else ""
    for obj in decision.objects:
        width = spread_of(CheckpointUri.parse(obj.uri).key, root)
        if width:
            return width
    return 0


def _store_has_newer(
    point: ResumePoint, s3_client: Any, known_damaged: set[int], spread: int = 0, workers: int = 8
) -> tuple[int, str] | None:
    """The newest committed checkpoint newer than ``point`` in a listing of its parent prefix
    (s3://… location, step) that the walk did not already skip as damaged, or None. ``spread``:
    the point was uploaded spread (``<hex>/…``, that many hex digits): every spread form of
    the parent prefix is listed too (16 ** spread listings, ``workers`` at a time: most are a
    short page, so they wait on the round trip rather than on parsing), so a newer checkpoint
    uploaded with the same spread is seen."""
    parsed = CheckpointUri.parse(point.path)
    if parsed.scheme != "s3" or s3_client is None:
        return None
    parent = posixpath.dirname(parsed.path.strip("/"))
    prefix = f"{parent}/" if parent else ""
    try:
        listed = list_spread(s3_client, parsed.bucket, prefix, width=spread, workers=workers)
        relatives = [key[len(prefix) :] for key, _ in listed]
    except Exception as exc:  # a listing is advice: never fail the restart on it
        _log.debug("cannot list %s for newer checkpoints: %s", prefix, exc)
        return None
    found = newer_in_listing(point, (r for r in relatives if _step_of(r) not in known_damaged))
    if found is None:
        return None
    return found[0], f"s3://{parsed.bucket}/{prefix}{found[1]}"


def _step_of(relative: str) -> int | None:
    found = committed_location(relative)
    return found[0] if found is not None else None


def connect_for_restart(database_url: str) -> AbstractContextManager[Any]:
    """One autocommit connection (polls see the writer's new rows; the walk opens its own
    REPEATABLE READ READ ONLY transaction)."""
    return read_only_connection(database_url, autocommit=True)
