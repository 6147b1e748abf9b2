"""Where to resume a job from: its latest complete checkpoint, read from the pipeline's database.

A checkpoint attempt is complete when ``world_size`` distinct ranks of its newest ``run_attempt``
reported (the writer keeps ``training_checkpoints.is_complete``; the view ``complete_checkpoints``
is the one definition readers select from; docs/DESIGN.md). The helper reads it, read-only, and
turns the stored URIs into the one location a framework loads from.

How ``ResumePoint.path`` is derived from the stored URIs
--------------------------------------------------------
1. Every rank reported the same URI (Lightning's DDP save: rank 0 writes one file and every rank
   reports it; a Hugging Face ``checkpoint-N`` directory; a sharded save's checkpoint directory,
   each rank listing its own files in ``extra.files``: DCP, Lightning's FSDP/ModelParallel/
   DeepSpeed): that URI.
2. The URIs differ (a caller's own reports, one file per rank): their deepest common directory.
   Such shards must therefore live inside that checkpoint's own directory
   (``…/step-10/rank-0.pt``).
3. ``file://`` URIs become local paths (``file:///ckpt/step=10.ckpt`` -> ``/ckpt/step=10.ckpt``);
   any other scheme (``s3://…``) is returned as the URL, which Lightning opens through fsspec. (The
   Hugging Face ``Trainer`` takes local directories only.)

With ``check_files`` (the default) every object of a complete checkpoint is checked in its store
(``trainer_client.storage.verify``: on ``s3://`` a listing of its keys, one request per
1,000, and a ``HeadObject`` only for what the listing cannot decide, or with
``verify_by="head"`` one per object, against its reported size, sha256 and pins; on
``file://`` its size): a checkpoint with an
object missing (rotated away by ``save_top_k`` / ``save_total_limit``, deleted by hand),
truncated or replaced is skipped, with one warning line naming the object and what differed,
for the next older complete one: a resume must not be pointed at a checkpoint that cannot load.
``deep=True`` also reads and hashes every object.

psycopg is imported lazily: the base install has none (``pip install 'ckpt-pipeline[ops]'``).
The connection is proxy-safe like the writer's (no startup options, no prepared statements, no
SET): a read-only REPEATABLE READ transaction, so a checkpoint and its shards are read from one
snapshot while the writer keeps writing.
"""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from trainer_client.exceptions import ResumeError
from trainer_client.restart.diverged import non_finite_loss, say_skipped
from trainer_client.restart.read_db import check_inputs, read_only_connection
from trainer_client.restart.shard_rows import ShardRows
from trainer_client.restart.walk import Candidate, complete_checkpoints
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import (
    VERIFY_MAX_WORKERS,
    ShardRecord,
    VerifyBy,
    expectations,
    verify_objects,
)

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint to resume from; ``path`` goes to ``ckpt_path=`` /
    ``resume_from_checkpoint=`` (see the module docstring for how it is derived)."""

    job_id: str
    step: int
    epoch: int
    run_attempt: int
    world_size: int
    uris: Mapping[int, str]
    path: str


def checkpoint_path(uris: Mapping[int, str]) -> str:
    """The one location the ranks' URIs name (rules 1-3 of the module docstring)."""
    if not uris:
        raise ResumeError("uris", "no shard URIs")
    distinct = sorted(set(uris.values()))
    if len(distinct) == 1:
        location = distinct[0]
    else:
        stores, directories = _stores_and_directories(distinct)
        if len(stores) != 1:
            raise ResumeError(
                "uri", f"shards are on different stores ({distinct[0]!r}, {distinct[-1]!r})"
            )
        common = posixpath.commonpath(directories)
        if common in ("", "/"):
            raise ResumeError(
                "uri", "shards share no checkpoint directory (only the root); see resume.py"
            )
        location = CheckpointUri.parse(distinct[0]).location(common)
    return _local_or_url(location)


# scheme://netloc/path with no params, query or fragment: split by one match, as CheckpointUri.parse
# would (100,000 ranks' URIs: parsing each costs seconds).
_PLAIN_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#;]*)(/[^?#;]*)?\Z")


def _stores_and_directories(uris: Iterable[str]) -> tuple[set[tuple[str, str]], set[str]]:
    """The distinct (scheme, netloc) of ``uris`` and the distinct directories of their paths."""
    stores: set[tuple[str, str]] = set()
    directories: set[str] = set()
    for uri in uris:
        plain = _PLAIN_URI.match(uri)
        if plain is not None:
            scheme, netloc, path = plain[1].lower(), plain[2], plain[3] or ""
        else:
            parsed = CheckpointUri.parse(uri)
            scheme, netloc, path = parsed.scheme, parsed.netloc, parsed.path
        stores.add((scheme, netloc))
        directories.add(posixpath.dirname(path.rstrip("/")))
    return stores, directories


def _local_or_url(uri: str) -> str:
    parsed = CheckpointUri.parse(uri)
    if parsed.scheme == "file":
        if not parsed.is_local_host:
            raise ResumeError("uri", f"file URI on another host ({parsed.netloc!r})")
        return parsed.decoded_path.rstrip("/") or "/"
    if parsed.scheme == "":
        return uri.rstrip("/") or "/"  # a bare path, as a caller's own reporter may store
    return uri.rstrip("/")


@dataclass(frozen=True)
class Verified:
    """A candidate that passed :func:`verified_point`: the point, and the shard rows it was
    verified against (what a restore fetches)."""

    point: ResumePoint
    shards: Mapping[int, ShardRecord]


def read_snapshot(database_url: str) -> AbstractContextManager[Any]:
    """A read-only REPEATABLE READ connection (one snapshot while the writer keeps writing);
    failures to connect or query become a ``ResumeError`` naming ``database_url``."""
    return read_only_connection(database_url)


def verified_point(
    job_id: str,
    step: int,
    epoch: int,
    run_attempt: int,
    world_size: int,
    shards: Mapping[int, ShardRecord],
    *,
    check_files: bool,
    deep: bool = False,
    s3_client: Any = None,
    max_workers: int = VERIFY_MAX_WORKERS,
    verify_by: VerifyBy = "listing",
    skipped: list[tuple[int, str]] | None = None,
) -> ResumePoint | None:
    """A complete checkpoint as a :class:`ResumePoint`, or None (with one warning) when a shard
    row is missing or, with ``check_files``, an object is not as reported: the one storage check
    of every helper that names a checkpoint to load (latest, best). ``skipped`` collects
    (step, why) of a checkpoint refused."""
    uris: Mapping[int, str]
    if isinstance(shards, ShardRows):
        # Decided from the rows' count and first and last rank (ranks are unique), and the
        # path from the one URI every rank reported where they did: nothing decoded.
        uris, complete, one_uri = shards.uris, shards.ranks_are(world_size), shards.one_uri
    else:
        uris = {rank: shard.uri for rank, shard in shards.items()}
        complete, one_uri = sorted(uris) == list(range(world_size)), None
    if not complete:
        # Cannot happen: the writer marks an attempt complete once world_size of its shard rows
        # are counted. Never resume from a partial one.
        _log.warning(
            "job %s step %s: ranks %s of %s stored", job_id, step, sorted(uris), world_size
        )
        if skipped is not None:
            skipped.append((step, f"{len(uris)} of {world_size} shard rows"))
        return None
    path = checkpoint_path({0: one_uri} if one_uri is not None else uris)
    if check_files:
        verified = verify_objects(
            expectations(shards.values()),
            deep=deep,
            s3_client=s3_client,
            max_workers=max_workers,
            verify_by=verify_by,
        )
        if not verified.intact:
            _log.warning(
                "job %s step %s is complete but not as reported: %s; trying another one",
                job_id,
                step,
                verified.summary(),
            )
            if skipped is not None:
                skipped.append((step, verified.summary()))
            return None
    return ResumePoint(job_id, step, epoch, run_attempt, world_size, uris, path)


def first_verified(
    job_id: str,
    walk: Iterable[Candidate],
    *,
    check_files: bool,
    deep: bool = False,
    s3_client: Any,
    max_workers: int,
    verify_by: VerifyBy = "listing",
    skipped: list[tuple[int, str]] | None = None,
    skip_diverged: bool = True,
) -> Verified | None:
    """The first candidate of ``walk`` that :func:`verified_point` accepts, with its shard rows
    (later candidates are not read), or None: the one walk of the latest and the best helper and
    of the restart's decision (which restores from the shard rows).

    With ``skip_diverged`` (the default) a checkpoint recorded as trained on a non-finite loss
    (:mod:`trainer_client.restart.diverged`) is passed over, read but not verified:
    resuming there only trains NaN further. The ones passed over are named in one line on
    stderr, whatever the logging setup, once the walk ends.
    """
    diverged: list[tuple[int, str]] = []
    try:
        for step, epoch, attempt, world, shards in walk:
            if skip_diverged:
                mark = non_finite_loss(shards)
                if mark is not None:
                    diverged.append((step, mark))
                    if skipped is not None:
                        skipped.append((step, f"diverged: trained on a non-finite loss ({mark})"))
                    continue
            point = verified_point(
                job_id,
                step,
                epoch,
                attempt,
                world,
                shards,
                check_files=check_files,
                deep=deep,
                s3_client=s3_client,
                max_workers=max_workers,
                verify_by=verify_by,
                skipped=skipped,
            )
            if point is not None:
                return Verified(point, shards)
        return None
    finally:
        say_skipped(job_id, diverged)


def latest_complete_checkpoint(
    job_id: str,
    *,
    database_url: str,
    check_files: bool = True,
    deep: bool = False,
    s3_client: Any = None,
    max_workers: int = VERIFY_MAX_WORKERS,
    verify_by: VerifyBy = "listing",
    resume_diverged: bool = False,
) -> ResumePoint | None:
    """The job's newest complete checkpoint whose objects are as reported (see the module
    docstring), or None if it has none. One recorded as trained on a non-finite loss is skipped
    with one line naming it, unless ``resume_diverged``.

    ``s3_client``: a boto3 S3 client to check ``s3://`` objects with (default: one from boto3's
    standard configuration, pooled for ``max_workers`` concurrent requests; a client of your own
    with a smaller pool caps the concurrency at its pool, with one warning). ``verify_by``:
    ``"listing"`` (default) or ``"head"`` (a HEAD per object), see ``verify_objects``. Raises
    ``VerifyError`` when the store cannot be asked (permission, network): nothing is skipped on
    a guess.
    """
    check_inputs(job_id, database_url)
    with read_snapshot(database_url) as conn:
        found = first_verified(
            job_id,
            complete_checkpoints(conn, job_id),
            check_files=check_files,
            deep=deep,
            s3_client=s3_client,
            max_workers=max_workers,
            verify_by=verify_by,
            skip_diverged=not resume_diverged,
        )
    return found.point if found is not None else None


def next_run_attempt(job_id: str, *, database_url: str) -> int:
    """1 + the newest ``run_attempt`` stored for the job (0 for a new job): for a resumed launch.

    A fresh ``torchrun`` counts ``TORCHELASTIC_RESTART_COUNT`` from 0 again, so a job resumed by a
    new launch would report as attempt 0 again, and a re-saved step would collide with the old
    attempt's reports (same identity: the first one written stays). Call this before ``fit()`` on
    every rank (no rank can report before all of them reach the first collective) and pass the
    result as ``run_attempt=``. Reports of the killed attempt still unsent in its spool are not
    seen here: they carry an older attempt only if some report of that attempt reached the
    database, so let the previous launch flush (or check ``ckpt-pipeline status``) first.
    """
    check_inputs(job_id, database_url)
    with read_only_connection(database_url) as conn:
        row = conn.execute(
            "SELECT max(run_attempt) FROM training_checkpoints WHERE job_id = %s", (job_id,)
        ).fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1
