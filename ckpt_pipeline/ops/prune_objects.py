"""``prune --delete-objects``: which stored objects the removed rows name, and deleting them.

Which (pure, :func:`objects_to_delete`): every URI a removed shard row names, except one that a
row which stays still names (a framework's ``last.ckpt``, a shard rewritten at the same path by
the attempt that superseded it), or that contains a path such a row names.

Deleting (:func:`delete_object`):

* ``file://`` (and bare paths): the file, or the directory tree the URI names; already gone
  counts as deleted. Files no report named (DCP's ``.metadata``) are not touched.
* ``s3://``: refused. A key can hold a newer object than the one reported (a later save to the
  same path), and only a pinned VersionId or ETag makes the delete exact; the shard rows carry
  none yet, so the rows stay and the object is listed as not deleted.
* anything else: refused, named.

A checkpoint whose objects were not all deleted keeps its rows (the caller's rule), so the
database never stops naming an object that is still there.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass(frozen=True)
class ShardObject:
    """A shard row's object: which checkpoint step it belongs to and where it is."""

    step: int
    uri: str


def objects_to_delete(
    removed: Iterable[ShardObject], staying_uris: Iterable[str]
) -> dict[int, tuple[str, ...]]:
    """Per step, the distinct URIs of its removed rows that no staying row needs."""
    staying = set(staying_uris)
    out: dict[int, list[str]] = {}
    for obj in removed:
        uris = out.setdefault(obj.step, [])
        if obj.uri not in uris and not _needed(obj.uri, staying):
            uris.append(obj.uri)
    return {step: tuple(sorted(uris)) for step, uris in sorted(out.items())}


def _needed(uri: str, staying: set[str]) -> bool:
    if uri in staying:
        return True
    prefix = uri.rstrip("/") + "/"
    return any(other.startswith(prefix) for other in staying)


def delete_object(uri: str) -> str | None:
    """Delete what ``uri`` names; None when it is gone, else why it was not deleted."""
    parsed = urlparse(uri)
    if parsed.scheme in ("file", ""):
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            return f"file URI on another host ({parsed.netloc!r})"
        return _delete_path(Path(unquote(parsed.path) if parsed.scheme else uri))
    if parsed.scheme == "s3":
        return (
            "s3 objects are deleted only by a pinned VersionId or ETag, and this row has none"
            " (a newer object at the same key must never be deleted)"
        )
    return f"scheme {parsed.scheme!r} is not supported (file://, s3://)"


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
