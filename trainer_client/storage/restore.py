"""Restore a verified checkpoint from S3 to local disk, checking every byte as it arrives.

What a restore guarantees:

* **Verified while streaming.** Each object is fetched as ranged GETs of ``part_bytes`` (at most
  ``max_workers`` at once, the objects' parts taken in turn) on threads that do nothing else;
  other threads take each object's parts in order, write each where it belongs (``pwrite``, its
  write-back to disk started at once) and feed it to the object's SHA-256
  (:mod:`trainer_client.storage.restore_fetch`); nothing is read back. An object whose size or
  SHA-256 is not the reported one fails the restore. The GETs name the reported ``VersionId``
  (else ``If-Match`` the reported ETag), so every part is of the version that was verified.
* **Atomic.** Objects land in a hidden temporary directory beside the destination
  (``.<name>.restoring-<pid>``), are fsynced, get a manifest (``.ckpt-restore.json``: every file's
  size and SHA-256), and only then is the directory renamed into place (parent fsynced). A killed
  restore leaves only the hidden directory, which no framework takes for a checkpoint (HF looks
  for ``checkpoint-N``, DCP for ``.metadata`` in the directory it is given) and which the next
  restore removes before starting again.
* **Tiered: local first.** A destination that holds our manifest equal to what the database
  reports, with every file at its size, is used as it is (no read); one without our manifest (the
  node's own copy, the ``uploaded_from`` directory) is used when every file has its reported size
  and SHA-256 (read once, locally). Anything else is replaced.
* **Once per node.** The restore runs under an exclusive ``flock`` on ``.<name>.restore.lock``
  beside the destination: the node's other ranks wait for it, then find the intact copy.

A single-object checkpoint (a Lightning ``.ckpt``) is restored the same way to a file.

A node's share (:mod:`trainer_client.restart.node_share`) may name only some objects and,
for some, only byte ranges (``ranges``); the manifest records those ranges, and a copy whose
manifest covers the share (a whole-checkpoint restore covers every share) is used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_client.storage.durable import fsync_dir, fsync_path, sha256_file, write_file_atomic
from trainer_client.storage.exceptions import RestoreError
from trainer_client.storage.restore_fetch import FetchTrace, fetch_all
from trainer_client.storage.uri import without_spread

MANIFEST = ".ckpt-restore.json"
# Ranged GETs of 8 MiB: boto3's TransferManager's default chunk size (multipart_chunksize), so
# the bench compares the same request pattern.
DEFAULT_PART_BYTES = 8 * 1024 * 1024
# Ranged GETs in flight (8 MiB each): bandwidth-bound, unlike verification's HEADs (64,
# storage/verify.py's VERIFY_MAX_WORKERS), so fewer threads fill the link.
RESTORE_MAX_WORKERS = 16


@dataclass(frozen=True)
class RemoteObject:
    """One object to restore: where it is, where it goes (relative; "" for a one-file
    checkpoint), and what its report says it is."""

    uri: str
    relative: str
    bytes: int
    sha256: str | None
    version_id: str | None = None
    etag: str | None = None


@dataclass(frozen=True)
class Restored:
    """Where the checkpoint is on this node, and how it got there."""

    path: Path
    # "manifest" (our earlier restore), "local" (a copy hashed in place), "store" (downloaded)
    source: str
    fetched_bytes: int = 0


def relative_name(root_uri: str, uri: str) -> str:
    """``uri``'s path below the checkpoint's ``root_uri`` ("" when it is the root itself); an
    object uploaded with ``spread_prefixes`` (``s3://bucket/<hex>/<root key>/…``) is named as
    if its spread segment were not there."""
    root = root_uri.rstrip("/")
    if not uri.startswith(root + "/") and uri != root:
        uri = without_spread(uri, root)
    if uri == root:
        return ""
    if not uri.startswith(root + "/"):
        raise RestoreError("uri", f"{uri} is not inside the checkpoint {root_uri}")
    name = uri[len(root) + 1 :]
    if not name or any(part in ("", ".", "..") for part in name.split("/")):
        raise RestoreError("uri", f"{uri}: not a plain relative name below {root_uri}")
    return name


def restore(
    objects: Sequence[RemoteObject],
    dest: Path,
    *,
    client: Any = None,
    max_workers: int = RESTORE_MAX_WORKERS,
    part_bytes: int = DEFAULT_PART_BYTES,
    trace: FetchTrace | None = None,
    ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    preloaded: Mapping[str, bytes] | None = None,
    relayed: Mapping[str, Sequence[tuple[int, bytes]]] | None = None,
) -> Restored:
    """Make ``dest`` an intact local copy of ``objects`` (see the module docstring); ``trace``,
    if given, is filled with what the download did (the bench's breakdown). ``ranges``: the
    objects (by relative name) of which only those (offset, length) ranges are wanted;
    ``preloaded``: objects whose bytes are already in memory (verified again as written);
    ``relayed``: byte ranges of ranged objects already in memory ((offset, bytes))."""
    ranges = {k: tuple((int(o), int(n)) for o, n in v) for k, v in (ranges or {}).items()}
    if not objects:
        raise RestoreError("objects", "nothing to restore")
    single = len(objects) == 1 and objects[0].relative == ""
    if not single and any(o.relative == "" for o in objects):
        raise RestoreError("objects", "a one-file checkpoint has exactly one object")
    dest = dest.absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _node_lock(dest):
        source = _intact(dest, objects, single=single, ranges=ranges)
        if source is not None:
            return Restored(dest, source)
        for stale in dest.parent.glob(f".{dest.name}.restoring-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a restore killed midway
        tmp = dest.parent / f".{dest.name}.restoring-{os.getpid()}"
        tmp.mkdir()
        try:
            target = tmp / dest.name if single else tmp
            if client is None:
                from trainer_client.storage.verify import s3_client_for

                client = s3_client_for(max_workers)
            fetched = fetch_all(
                objects,
                target,
                client,
                max_workers,
                part_bytes,
                single=single,
                trace=trace,
                ranges=ranges,
                preloaded=preloaded,
                relayed=relayed,
            )
            _write_manifest(tmp, dest, objects, single=single, ranges=ranges)
            _swap_into_place(target, dest, objects, single=single)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Restored(dest, "store", fetched)


# -- local first ---------------------------------------------------------------------------------


def _manifest_path(dest: Path, *, single: bool) -> Path:
    return dest.parent / f".{dest.name}{MANIFEST}" if single else dest / MANIFEST


def _manifest(
    objects: Sequence[RemoteObject], ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None
) -> list[list[Any]]:
    """One entry per object: [relative, bytes, sha256], plus [[offset, length], …] for one
    restored in part."""
    ranges = ranges or {}
    return sorted(
        [o.relative, o.bytes, o.sha256]
        + ([[list(r) for r in ranges[o.relative]]] if o.relative in ranges else [])
        for o in objects
    )


def _covers(recorded: Any, wanted: list[list[Any]]) -> bool:
    """Whether a manifest read back records every wanted entry: same size and SHA-256, and
    whole, or in part with every wanted range inside its recorded ones."""
    if not isinstance(recorded, list):
        return False
    have = {e[0]: e for e in recorded if isinstance(e, list) and len(e) in (3, 4)}
    for entry in wanted:
        held = have.get(entry[0])
        if held is None or held[1:3] != entry[1:3]:
            return False
        if len(held) == 3:
            continue  # held whole: covers any part
        if len(entry) == 3:
            return False  # held in part, wanted whole
        if not all(any(a <= o and o + n <= a + m for a, m in held[3]) for o, n in entry[3]):
            return False
    return True


def _file_of(dest: Path, obj: RemoteObject) -> Path:
    return dest / obj.relative if obj.relative else dest


def _intact(
    dest: Path,
    objects: Sequence[RemoteObject],
    *,
    single: bool,
    ranges: Mapping[str, Sequence[tuple[int, int]]],
) -> str | None:
    """ "manifest" or "local" when ``dest`` already holds the checkpoint, else None (a copy
    without our manifest must hold every object whole: a range cannot be hashed alone)."""
    if not (dest.is_file() if single else dest.is_dir()):
        return None
    for obj in objects:
        try:
            if _file_of(dest, obj).stat().st_size != obj.bytes:
                return None
        except OSError:
            return None
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads(_manifest_path(dest, single=single).read_text())
        if _covers(recorded, _manifest(objects, ranges)):
            return "manifest"
    for obj in objects:
        if obj.sha256 is None or sha256_file(_file_of(dest, obj)) != obj.sha256:
            return None
    return "local"


@contextlib.contextmanager
def _node_lock(dest: Path) -> Iterator[None]:
    fd = os.open(dest.parent / f".{dest.name}.restore.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_manifest(
    tmp: Path,
    dest: Path,
    objects: Sequence[RemoteObject],
    *,
    single: bool,
    ranges: Mapping[str, Sequence[tuple[int, int]]],
) -> None:
    if single:  # beside the file, once the file is in place (_swap_into_place)
        return
    (tmp / MANIFEST).write_text(json.dumps(_manifest(objects, ranges)))
    fsync_path(tmp / MANIFEST)
    fsync_dir(tmp)


def _swap_into_place(
    target: Path, dest: Path, objects: Sequence[RemoteObject], *, single: bool
) -> None:
    stale = dest.parent / f".{dest.name}.restoring-{os.getpid()}-old"
    if dest.exists() or dest.is_symlink():
        dest.rename(stale)  # a damaged copy: out of the way first, never merged into
    target.rename(dest)
    fsync_dir(dest.parent)
    if single:
        # Written after the file: a kill in between leaves a verified file without a manifest,
        # which the next start hashes in place ("local").
        manifest = json.dumps(_manifest(objects)).encode()
        write_file_atomic(_manifest_path(dest, single=True), manifest)
    if stale.is_dir() and not stale.is_symlink():
        shutil.rmtree(stale, ignore_errors=True)
    elif stale.exists() or stale.is_symlink():
        stale.unlink()
