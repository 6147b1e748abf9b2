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
checkpoints newest first through :func:`trainer_client.integrations.resume.first_verified` (the
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
from dataclasses import dataclass
from typing import Any

from trainer_client.integrations._layouts import COMMITTED as _COMMITTED
from trainer_client.integrations.exceptions import ResumeError
from trainer_client.integrations.resume import CONNECT_TIMEOUT_S, ResumePoint, first_verified
from trainer_client.integrations.walk import complete_checkpoints
from trainer_client.storage.restore import RemoteObject, relative_name
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import Expected, ShardRecord, expectations

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
    """What every rank receives (picklable: it travels by ``broadcast_object_list``)."""

    point: ResumePoint | None
    # The objects to fetch when the checkpoint is in S3 (empty for a local one).
    objects: tuple[RemoteObject, ...] = ()
    # Where the checkpoint was uploaded from (its reports' extra.uploaded_from), if they say.
    uploaded_from: str | None = None
    error: str | None = None


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


def wait_until_written(
    conn: Any, job_id: str, in_flight: Iterable[InFlight], deadline: float
) -> list[InFlight]:
    """Poll until every report in ``in_flight`` has its row and the checkpoints they complete
    are marked complete (see :data:`_SETTLING`); returns the reports still missing or unsettled
    at the deadline."""
    missing = sorted(set(in_flight))
    while missing:
        steps = sorted({s for s, _, _ in missing})
        rows = conn.execute(_WRITTEN, {"job_id": job_id, "steps": steps}).fetchall()
        written = {(step, rank): attempt for step, rank, attempt in rows}
        settling = {row[0] for row in conn.execute(_SETTLING, {"job_id": job_id, "steps": steps})}
        missing = [
            (step, attempt, rank)
            for step, attempt, rank in missing
            if written.get((step, rank), -1) < attempt or step in settling
        ]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    return missing


def decide(
    conn: Any,
    job_id: str,
    in_flight: Iterable[InFlight],
    deadline: float,
    *,
    check_files: bool,
    s3_client: Any,
    max_workers: int,
) -> Decision:
    """The job's resume decision (see the module docstring); ``conn`` is in autocommit mode."""
    reports = sorted(set(in_flight))
    missing = wait_until_written(conn, job_id, reports, deadline)
    if missing:
        _log.warning(
            "job %s: %s of %s report(s) sent at this restart not yet written at the deadline "
            "(first: step %s rank %s attempt %s); answering from what the database holds",
            job_id,
            len(missing),
            len(reports),
            missing[0][0],
            missing[0][2],
            missing[0][1],
        )
    with conn.transaction():
        found = first_verified(
            job_id,
            complete_checkpoints(conn, job_id),
            check_files=check_files,
            s3_client=s3_client,
            max_workers=max_workers,
        )
    if found is None:
        return Decision(None)
    decision = _with_objects(found.point, found.shards)
    _warn_if_store_has_newer(found.point, s3_client)
    return decision


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
    best: tuple[int, str] | None = None
    for relative in relatives:
        for pattern in _COMMITTED:
            match = pattern.match(relative)
            if match is None:
                continue
            step = int(match.group("step"))
            if step > point.step and (best is None or step > best[0]):
                best = (step, match.group("loc"))
    return best


def _warn_if_store_has_newer(point: ResumePoint, s3_client: Any) -> None:
    parsed = CheckpointUri.parse(point.path)
    if parsed.scheme != "s3" or s3_client is None:
        return
    parent = posixpath.dirname(parsed.path.strip("/"))
    prefix = f"{parent}/" if parent else ""
    try:
        relatives: list[str] = []
        pages = s3_client.get_paginator("list_objects_v2").paginate(
            Bucket=parsed.bucket, Prefix=prefix
        )
        for page in pages:
            relatives += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
    except Exception as exc:  # a listing is advice: never fail the restart on it
        _log.debug("cannot list %s for newer checkpoints: %s", prefix, exc)
        return
    found = newer_in_listing(point, relatives)
    if found is not None:
        _log.warning(
            "job %s: s3://%s/%s%s (step %s) is in the store but not complete in the database "
            "(resuming from step %s): its reports may have been lost with a node-local spool; "
            "ckpt-pipeline reconcile --job %s --store s3://%s/%s --backfill reports it",
            point.job_id,
            parsed.bucket,
            prefix,
            found[1],
            found[0],
            point.step,
            point.job_id,
            parsed.bucket,
            prefix.rstrip("/"),
        )


def connect(database_url: str) -> Any:
    """One autocommit connection (polls see the writer's new rows; the walk opens its own
    REPEATABLE READ READ ONLY transaction)."""
    from psycopg import IsolationLevel

    from trainer_client.integrations.resume import _import_psycopg

    psycopg = _import_psycopg()
    try:
        conn = psycopg.connect(
            database_url,
            prepare_threshold=None,
            connect_timeout=CONNECT_TIMEOUT_S,
            autocommit=True,
        )
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ResumeError("database_url", f"cannot connect: {first}") from None
    conn.isolation_level = IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn
