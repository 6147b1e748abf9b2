"""``prune --delete-objects``: which stored objects the removed rows name, and deleting them.

Which (pure, :func:`objects_to_delete`; the rows read by :func:`delete_objects`): every object a
removed shard row names (its pinned objects, else its ``uri``), except one that a row which stays
still names (a framework's ``last.ckpt``, a shard rewritten at the same path by the attempt that
superseded it; its ``uri`` or one of its pins), or that contains a path such a row names.

Deleting (:func:`delete_object`):

* ``file://`` (and bare paths): the file, or the directory tree the URI names; already gone
  counts as deleted. Files no report named (DCP's ``.metadata``) are not touched.
* ``s3://``: only the object the report pinned (``objects``: ckpt_contract/objects.py), never
  whatever the key holds now (a later save to the same path): with a pinned VersionId that
  version (``DeleteObject(VersionId=…)``), else with a pinned ETag ``DeleteObject(IfMatch=…)``,
  which S3 refuses (412) when the key holds another object. A version or object already gone
  (404, or 412: replaced, so the pinned bytes are gone too) counts as deleted. A row with no pin
  for the object is refused: the rows stay and the object is listed as not deleted.
* anything else: refused, named.

A checkpoint whose objects were not all deleted keeps its rows (the caller's rule), so the
database never stops naming an object that is still there.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lambda_writer import NotDeleted, ObjectsRemoved, Removal
from trainer_client.storage.uri import CheckpointUri, without_spread

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardObject:
    """A shard row's object: which checkpoint step it belongs to, where it is, and its pins."""

    step: int
    uri: str
    version_id: str | None = None
    etag: str | None = None


def shard_objects(step: int, uri: str, pins: Any) -> list[ShardObject]:
    """The objects one shard row names: its pinned objects, else its ``uri``."""
    if isinstance(pins, list) and pins:
        return [
            ShardObject(step, str(p["uri"]), p.get("version_id"), p.get("etag"))
            for p in pins
            if isinstance(p, dict) and isinstance(p.get("uri"), str)
        ]
    return [ShardObject(step, uri)]


def objects_to_delete(
    removed: Iterable[ShardObject], staying_uris: Iterable[str]
) -> dict[int, tuple[ShardObject, ...]]:
    """Per step, the distinct objects of its removed rows that no staying row needs."""
    staying = set(staying_uris)
    out: dict[int, list[ShardObject]] = {}
    for obj in removed:
        objects = out.setdefault(obj.step, [])
        if obj not in objects and not _needed(obj.uri, staying):
            objects.append(obj)
    return {step: tuple(sorted(objs, key=lambda o: o.uri)) for step, objs in sorted(out.items())}


@dataclass
class ObjectDeletion:
    """``--delete-objects`` of one prune (``lambda_writer.ObjectRemover``): the S3 client, made
    on the first ``s3://`` object."""

    s3_client: Any = None

    def __call__(
        self, conn: Any, job_id: str, whole: list[Removal], superseded: list[Removal]
    ) -> ObjectsRemoved:
        return delete_objects(conn, job_id, whole, superseded, self)


def planned_objects(
    conn: Any, job_id: str, whole: list[Any], superseded: list[Any]
) -> dict[int, tuple[ShardObject, ...]]:
    """Per step, the objects that removing ``whole`` checkpoints and ``superseded`` rows (below
    their checkpoint's attempt) would delete: what the dry run lists and --apply deletes."""
    whole_steps = {r.step for r in whole}
    current = {r.step: r.run_attempt for r in superseded}

    def goes(step: int, attempt: int) -> bool:
        return step in whole_steps or (step in current and attempt < current[step])

    rows = conn.execute(
        "SELECT step, run_attempt, uri, coalesce(objects, extra->'objects')"
        " FROM training_checkpoint_shards WHERE job_id = %s AND step = ANY(%s::bigint[])",
        (job_id, sorted(whole_steps | set(current))),
    ).fetchall()
    removed = [
        (obj, str(u))
        for s, a, u, pins in rows
        if goes(int(s), int(a))
        for obj in shard_objects(int(s), str(u), pins)
    ]
    # A spread object (``s3://bucket/<hex>/key``, storage/uri.py) is named by rows whose ``uri``
    # is under its unspread form: those are looked up too (their pins name it exactly).
    uris = sorted({o.uri for o, _ in removed} | {without_spread(o.uri, u) for o, u in removed})
    # Rows that may name one of them: a URI under one (LIKE its prefix) or above one (one of its
    # parent paths, whose pins may list it). The exact test is _needed, below.
    others = conn.execute(
        "SELECT step, run_attempt, uri, coalesce(objects, extra->'objects')"
        " FROM training_checkpoint_shards"
        " WHERE job_id = %s AND (uri LIKE ANY(%s::text[]) OR uri = ANY(%s::text[]))",
        (job_id, [_like_prefix(u) for u in uris], sorted({p for u in uris for p in _parents(u)})),
    ).fetchall()
    staying = [
        obj.uri
        for s, a, u, pins in others
        if not goes(int(s), int(a))
        for obj in [ShardObject(int(s), str(u)), *shard_objects(int(s), str(u), pins)]
    ]
    return objects_to_delete((o for o, _ in removed), staying)


def delete_objects(
    conn: Any, job_id: str, whole: list[Any], superseded: list[Any], deletion: ObjectDeletion
) -> ObjectsRemoved:
    """Delete the objects of the rows about to go (``whole`` checkpoints, ``superseded`` rows
    below their checkpoint's attempt); returns the steps where one was not deleted."""
    done = ObjectsRemoved()
    for step, objects in planned_objects(conn, job_id, whole, superseded).items():
        for obj in objects:
            if deletion.s3_client is None and obj.uri.startswith("s3://"):
                from trainer_client.storage.verify import s3_client_for

                deletion.s3_client = s3_client_for(max_workers=1)
            reason = delete_object(obj, s3_client=deletion.s3_client)
            if reason is None:
                done.deleted += 1
            else:
                done.failed.add(step)
                done.not_deleted.append(NotDeleted(step, obj.uri, reason))
                logger.warning("job %s step %s: %s not deleted: %s", job_id, step, obj.uri, reason)
    return done


def _like_prefix(uri: str) -> str:
    """A LIKE pattern for ``uri`` itself and anything under it."""
    escaped = uri.rstrip("/").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def _parents(uri: str) -> list[str]:
    """Every parent path of ``uri``, with and without its trailing slash."""
    out = []
    head = uri.rstrip("/")
    while "/" in head and not head.endswith(":/"):
        head = head.rsplit("/", 1)[0]
        out += [head, head + "/"]
    return out


def _needed(uri: str, staying: set[str]) -> bool:
    if uri in staying:
        return True
    prefix = uri.rstrip("/") + "/"
    return any(other.startswith(prefix) for other in staying)


def delete_object(obj: ShardObject, *, s3_client: Any = None) -> str | None:
    """Delete ``obj``; None when it is gone, else why it was not deleted."""
    parsed = CheckpointUri.parse(obj.uri)
    if parsed.scheme in ("file", ""):
        if parsed.scheme == "file" and not parsed.is_local_host:
            return f"file URI on another host ({parsed.netloc!r})"
        return _delete_path(parsed.local_path if parsed.scheme else Path(obj.uri))
    if parsed.scheme == "s3":
        if obj.version_id is None and obj.etag is None:
            return (
                "s3 objects are deleted only by a pinned VersionId or ETag, and this row has none"
                " (a newer object at the same key must never be deleted)"
            )
        return _delete_s3(obj, parsed.bucket, parsed.key, s3_client)
    return f"scheme {parsed.scheme!r} is not supported (file://, s3://)"


def _delete_s3(obj: ShardObject, bucket: str, key: str, client: Any) -> str | None:
    from botocore.exceptions import BotoCoreError, ClientError

    pin: dict[str, str] = (
        {"VersionId": obj.version_id} if obj.version_id is not None else {"IfMatch": str(obj.etag)}
    )
    try:
        client.delete_object(Bucket=bucket, Key=key, **pin)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "NoSuchVersion", "PreconditionFailed") or status in (404, 412):
            return None  # the pinned object is gone already (deleted, or replaced at its key)
        return f"S3 {code or status}: {error.get('Message', '')}".rstrip(": ")
    except BotoCoreError as exc:
        return f"S3: {exc}"
    return None


def _delete_path(path: Path) -> str | None:
    if not path.is_absolute():
        return f"{path} is not an absolute path"
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None
