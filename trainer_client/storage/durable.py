"""Durable files: every fsync, atomic write and checksum the client makes, in one place.

A file is durable once its data and the directory entry that names it are both on disk: fsync of
the file, then fsync of each directory the rename or creation touched. Read-only descriptors are
enough for both (fsync flushes a file's pages whoever wrote them), so a process that did not write
a file can still make it durable before reporting it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Large reads: one syscall per 8 MiB keeps the hashing threads on the CPU rather than in the
# kernel's entry path, and hashlib releases the GIL for the whole update() of such a buffer.
HASH_CHUNK_BYTES = 8 * 1024 * 1024


def fsync_path(path: str | os.PathLike[str], *, directory: bool = False) -> None:
    """fsync a file or a directory through a read-only descriptor."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# include/uapi/linux/fs.h: wait for write-back already under way, start it, wait for it.
_SYNC_FILE_RANGE_WAIT_BEFORE, _SYNC_FILE_RANGE_WRITE, _SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
_sync_file_range: Any
try:
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
except (OSError, AttributeError):  # not Linux: the final fsync does all the write-back
    _sync_file_range = None


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing a range's dirty pages back to disk, without waiting for it (Linux
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing): a later fsync then has little
    left to write. Not durability by itself: only the fsync is."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def fsync_in_slices(
    path: str | os.PathLike[str],
    slice_bytes: int,
    after_slice: Callable[[int], None] | None = None,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> None:
    """fsync a file, its data written back ``slice_bytes`` at a time first.

    Each slice is written and waited for with ``sync_file_range`` (no journal commit), then
    ``after_slice(n)`` may sleep: the disk queue holds one slice of it at a time, so the
    training's own I/O interleaves, and a pacer can spread the write-back out. The final fsync
    then has only the metadata left. ``slice_bytes`` 0 (or no ``sync_file_range``): one fsync.
    ``should_stop`` is polled between slices (``InterruptedError``).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if slice_bytes > 0 and _sync_file_range is not None:
            flags = (
                _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER
            )
            for offset in range(0, size, slice_bytes):
                if should_stop is not None and should_stop():
                    raise InterruptedError(f"write-back of {path} stopped")
                n = min(slice_bytes, size - offset)
                if _sync_file_range(fd, offset, n, flags) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"sync_file_range: {os.strerror(err)}", str(path))
                if after_slice is not None:
                    after_slice(n)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory: makes the entries created, renamed or removed in it durable."""
    fsync_path(path, directory=True)


def fsync_file_and_dir(path: str | os.PathLike[str]) -> int:
    """fsync ``path`` and its directory (the rename that put it there); returns its size."""
    target = Path(path)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    fsync_dir(target.parent)
    return size


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` or raise: ``os.write`` may write part of a buffer without
    raising (a full disk, RLIMIT_FSIZE), which would otherwise leave a torn record."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "short write (no space left)")
        view = view[written:]


def mkdir_durable(directory: Path) -> None:
    """``mkdir -p`` whose new entries survive a crash: fsync each new directory's parent."""
    missing = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    directory.mkdir(parents=True, exist_ok=True)
    for new in reversed(missing):
        fsync_dir(new.parent)


def open_append(path: Path) -> int:
    """Open ``path`` for appending; a file this call creates is durable in its directory."""
    existed = path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if not existed:
        os.fsync(fd)
        fsync_dir(path.parent)
    return fd


def write_file_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: temp file, fsync, rename, fsync the directory.

    A crash leaves either no file, the old file or the new one, never a torn one (the temp file
    can be left behind; its name starts with a dot and ends in ``.tmp``).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    fsync_dir(path.parent)


def remove_durable(path: Path) -> None:
    """Remove ``path`` (if there) and make the removal durable."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


@dataclass(frozen=True)
class FileIdentity:
    """What says a file is still the one that was saved: inode, size, modification time.

    A rename keeps all three; a rewrite or a new file under the same name changes at least one.
    """

    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileIdentity:
        """The identity of ``path`` now (raises ``FileNotFoundError`` when it is gone)."""
        st = Path(path).stat()
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


def sha256_file(
    path: str | os.PathLike[str],
    chunk_bytes: int = HASH_CHUNK_BYTES,
    *,
    should_stop: Callable[[], bool] | None = None,
    after_chunk: Callable[[int], None] | None = None,
) -> str:
    """The SHA-256 of one file, read in ``chunk_bytes`` pieces into one reused buffer.

    ``should_stop`` is polled between chunks; when it returns True the hashing ends with
    ``InterruptedError`` (so a close() deadline holds even for a file of many gigabytes).
    ``after_chunk(n)`` is called after each chunk (a pacer may sleep in it).
    """
    digest = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    with Path(path).open("rb", buffering=0) as f:
        while True:
            if should_stop is not None and should_stop():
                raise InterruptedError(f"hashing of {path} stopped")
            n = f.readinto(view)
            if not n:
                break
            digest.update(view[:n])
            if after_chunk is not None:
                after_chunk(n)
    return digest.hexdigest()


def sha256_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    executor: Executor | None = None,
    threads: int = 4,
    chunk_bytes: int = HASH_CHUNK_BYTES,
    should_stop: Callable[[], bool] | None = None,
    after_chunk: Callable[[int], None] | None = None,
) -> list[str]:
    """SHA-256 of several files in parallel threads (reads and hashlib release the GIL).

    Memory is ``threads × chunk_bytes`` whatever the files' sizes. The largest files start
    first, so that one big file does not end up hashing alone at the end. ``executor`` (a
    thread pool the caller keeps) is used when given, else one of ``threads`` for this call.
    """
    if executor is None and (threads <= 1 or len(paths) <= 1):
        return [
            sha256_file(p, chunk_bytes, should_stop=should_stop, after_chunk=after_chunk)
            for p in paths
        ]
    order = sorted(range(len(paths)), key=lambda i: -Path(paths[i]).stat().st_size)
    with contextlib.ExitStack() as stack:
        pool = executor or stack.enter_context(
            ThreadPoolExecutor(max_workers=min(threads, len(paths)), thread_name_prefix="sha256")
        )
        futures = {
            i: pool.submit(
                sha256_file, paths[i], chunk_bytes, should_stop=should_stop, after_chunk=after_chunk
            )
            for i in order
        }
        return [futures[i].result() for i in range(len(paths))]


def parents_up_to(files: Iterable[Path], base: Path) -> list[Path]:
    """Every directory between each file and ``base`` (inclusive), plus ``base``'s parent,
    deepest first: the order in which fsync makes a new tree's entries durable."""
    directories = {base, base.parent}
    for path in files:
        parent = path.parent
        while parent != base and base in parent.parents:
            directories.add(parent)
            parent = parent.parent
    return sorted(directories, key=lambda p: len(p.parts), reverse=True)
