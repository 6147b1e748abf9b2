"""Restore a verified checkpoint from S3 to local disk, checking every byte as it arrives.

What a restore guarantees:

* **Verified while streaming.** Each object is fetched as ranged GETs of ``part_bytes`` (at most
  ``max_workers`` at once, the objects' parts taken in turn), each part written where it belongs
  (``pwrite``, its write-back to disk started at once) and handed, in order, to the object's
  SHA-256 by whichever worker holds the next part, while the others go on fetching; nothing is
  read back. An object whose size or SHA-256 is not the reported one fails the restore. The GETs
  name the reported ``VersionId`` (else ``If-Match`` the reported ETag), so every part is of the
  version that was verified.
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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_client.storage.durable import (
    fsync_dir,
    fsync_path,
    sha256_file,
    start_writeback,
    write_file_atomic,
)
from trainer_client.storage.exceptions import RestoreError
from trainer_client.storage.uri import CheckpointUri

MANIFEST = ".ckpt-restore.json"
# Ranged GETs of 8 MiB: boto3's TransferManager's default chunk size (multipart_chunksize), so
# the bench compares the same request pattern.
DEFAULT_PART_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_WORKERS = 16
# Parts held in memory waiting for an earlier part of their object, beyond those in flight: 16
# of 8 MiB is 128 MiB, plus 16 in flight, 256 MiB in all, about boto3 TransferManager's own
# bound on buffered download chunks (max_in_memory_download_chunks, 1,000 of 256 KiB).
_WAITING_PARTS = 16


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
    """``uri``'s path below the checkpoint's ``root_uri`` ("" when it is the root itself)."""
    root = root_uri.rstrip("/")
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
    max_workers: int = DEFAULT_MAX_WORKERS,
    part_bytes: int = DEFAULT_PART_BYTES,
) -> Restored:
    """Make ``dest`` an intact local copy of ``objects`` (see the module docstring)."""
    if not objects:
        raise RestoreError("objects", "nothing to restore")
    single = len(objects) == 1 and objects[0].relative == ""
    if not single and any(o.relative == "" for o in objects):
        raise RestoreError("objects", "a one-file checkpoint has exactly one object")
    dest = dest.absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _node_lock(dest):
        source = _intact(dest, objects, single=single)
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
            fetched = _fetch_all(objects, target, client, max_workers, part_bytes, single=single)
            _write_manifest(tmp, dest, objects, single=single)
            _swap_into_place(target, dest, objects, single=single)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Restored(dest, "store", fetched)


# -- local first ---------------------------------------------------------------------------------


def _manifest_path(dest: Path, *, single: bool) -> Path:
    return dest.parent / f".{dest.name}{MANIFEST}" if single else dest / MANIFEST


def _manifest(objects: Sequence[RemoteObject]) -> list[list[Any]]:
    return sorted([o.relative, o.bytes, o.sha256] for o in objects)


def _file_of(dest: Path, obj: RemoteObject) -> Path:
    return dest / obj.relative if obj.relative else dest


def _intact(dest: Path, objects: Sequence[RemoteObject], *, single: bool) -> str | None:
    """ "manifest" or "local" when ``dest`` already holds the checkpoint, else None."""
    if not (dest.is_file() if single else dest.is_dir()):
        return None
    for obj in objects:
        try:
            if _file_of(dest, obj).stat().st_size != obj.bytes:
                return None
        except OSError:
            return None
    with contextlib.suppress(OSError, ValueError):
        if json.loads(_manifest_path(dest, single=single).read_text()) == _manifest(objects):
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
    tmp: Path, dest: Path, objects: Sequence[RemoteObject], *, single: bool
) -> None:
    if single:  # beside the file, once the file is in place (_swap_into_place)
        return
    (tmp / MANIFEST).write_text(json.dumps(_manifest(objects)))
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


# -- the download ----------------------------------------------------------------------------------


@dataclass
class _Object:
    """One object being restored: its file, and the SHA-256 fed with its parts in order."""

    remote: RemoteObject
    fd: int
    parts: int
    next_part: int = 0
    received: int = 0
    waiting: dict[int, bytes] = field(default_factory=dict)
    # A worker is feeding the digest: the others leave their parts in ``waiting`` and go on.
    hashing: bool = False
    digest: Any = field(default_factory=hashlib.sha256)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _interleaved(states: Sequence[_Object]) -> Iterator[tuple[_Object, int]]:
    """Every part of every object, the objects taken in turn (part 0 of each, then part 1, …):
    the parts in flight belong to many objects, so their SHA-256s advance side by side on
    several cores instead of one object's parts queueing behind one digest."""
    for index in range(max(state.parts for state in states)):
        for state in states:
            if index < state.parts:
                yield state, index


def _fetch_all(
    objects: Sequence[RemoteObject],
    target: Path,
    client: Any,
    max_workers: int,
    part_bytes: int,
    *,
    single: bool,
) -> int:
    states = []
    try:
        for obj in objects:
            path = target if single else target / obj.relative
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            states.append(_Object(obj, fd, max(1, -(-obj.bytes // part_bytes))))
            os.ftruncate(fd, obj.bytes)
        # Parts fetched and not yet hashed are held in memory: at most this many are
        # outstanding (in flight, or waiting for an earlier part of their object to be hashed).
        # Room for _WAITING_PARTS beyond the workers' own: a slow GET then holds back only the
        # parts behind it, not the others' requests (with 4 spare slots, a slow part's
        # successors filled them and every worker idled until it came).
        slots = threading.BoundedSemaphore(max_workers + _WAITING_PARTS)
        failed = threading.Event()
        futures: list[Future[None]] = []
        with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="restore") as pool:
            for state, index in _interleaved(states):
                while not slots.acquire(timeout=0.5):
                    if failed.is_set():
                        break
                if failed.is_set():
                    break
                futures.append(
                    pool.submit(_fetch_part, state, index, part_bytes, client, slots, failed)
                )
            for future in futures:
                exc = future.exception()
                if exc is not None:
                    failed.set()
                    for other in futures:
                        other.cancel()
                    raise exc
        total = 0
        for state in states:
            _check_done(state)
            # Durable before the rename: the write-back started part by part (start_writeback),
            # so this mostly waits for what is still in flight.
            os.fsync(state.fd)
            total += state.received
        for directory in sorted({target.parent if single else target} | _dirs(target, states)):
            fsync_dir(directory)
        return total
    finally:
        for state in states:
            with contextlib.suppress(OSError):
                os.close(state.fd)


def _dirs(target: Path, states: Sequence[_Object]) -> set[Path]:
    out: set[Path] = set()
    for state in states:
        parent = (target / state.remote.relative).parent if state.remote.relative else target
        while parent != target and target in parent.parents:
            out.add(parent)
            parent = parent.parent
    return out


def _fetch_part(
    state: _Object,
    index: int,
    part_bytes: int,
    client: Any,
    slots: threading.BoundedSemaphore,
    failed: threading.Event,
) -> None:
    if failed.is_set():
        slots.release()
        return
    remote = state.remote
    start = index * part_bytes
    end = min(remote.bytes, start + part_bytes) - 1
    try:
        data = _get_range(client, remote, start, end) if remote.bytes else b""
        expected = end - start + 1 if remote.bytes else 0
        if len(data) != expected:
            raise RestoreError(
                "bytes", f"{remote.uri}: part at {start} has {len(data)} B, expected {expected} B"
            )
        if data:
            os.pwrite(state.fd, data, start)
            # The disk's work starts now, beside the other parts' GETs: the fsync before the
            # rename then waits for little instead of writing the whole checkpoint at the end.
            start_writeback(state.fd, start, len(data))
    except BaseException:
        failed.set()
        slots.release()
        raise
    with state.lock:
        state.waiting[index] = data
        if state.hashing:
            return  # the worker feeding the digest takes this part when its turn comes
        state.hashing = True
    _feed_digest(state, slots)


def _feed_digest(state: _Object, slots: threading.BoundedSemaphore) -> None:
    """Hash the object's parts that are next in order, outside the lock (so workers finishing
    other parts of it never wait for the digest), until the next one has not arrived."""
    while True:
        with state.lock:
            chunk = state.waiting.pop(state.next_part, None)
            if chunk is None:
                state.hashing = False
                return
            state.next_part += 1
        state.digest.update(chunk)  # releases the GIL for large buffers
        state.received += len(chunk)  # only the one hashing worker writes it
        slots.release()


def _get_range(client: Any, remote: RemoteObject, start: int, end: int) -> bytes:
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = CheckpointUri.parse(remote.uri)
    if parsed.scheme != "s3":
        raise RestoreError("uri", f"{remote.uri}: only s3:// objects are restored")
    extra: dict[str, str] = {}
    if remote.version_id:
        extra["VersionId"] = remote.version_id
    elif remote.etag:
        extra["IfMatch"] = remote.etag
    try:
        response = client.get_object(
            Bucket=parsed.bucket,
            Key=parsed.key,
            Range=f"bytes={start}-{end}",
            **extra,
        )
        return bytes(response["Body"].read())
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise RestoreError(
            "uri", f"{remote.uri}: {error.get('Code')} {error.get('Message') or ''}".rstrip()
        ) from None
    except BotoCoreError as exc:
        raise RestoreError("uri", f"{remote.uri}: {exc}") from None


def _check_done(state: _Object) -> None:
    remote = state.remote
    if state.next_part != state.parts or state.received != remote.bytes:
        raise RestoreError(
            "bytes", f"{remote.uri}: received {state.received} B, reported {remote.bytes} B"
        )
    digest = state.digest.hexdigest()
    if remote.sha256 is not None and digest != remote.sha256:
        raise RestoreError("sha256", f"{remote.uri}: sha256 {digest}, reported {remote.sha256}")
