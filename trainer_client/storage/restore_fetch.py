"""The restore's download: ranged GETs on threads that do nothing else, each object's parts
written, hashed and handed to write-back in order on others.

Why network and disk are apart: when each GET worker also wrote its part, fed the digest and
started the part's write-back, a 1 GB restore on LocalStack kept on average 7.5–9.4 of its 16
requests in flight (BENCHMARKS.md §9, the trace): ``sync_file_range(WRITE)`` blocked a worker
for up to 0.6 s (ext4 allocates the blocks in the caller, and the device queue fills), and the
digest's turns took 85 ms at the median on two busy cores, each a request not made. boto3's
TransferManager keeps its writes on one IO thread for the same reason. Here:

* ``max_workers`` **GET threads** fetch the objects' parts (taken in turn, part 0 of each object,
  then part 1, …, so the parts in flight belong to many objects) and hand each body over;
* a few **ordered threads** (one per core, at most one per object at a time) take an object's
  parts in order: ``pwrite`` where the part belongs, then SHA-256 (hashlib releases the GIL);
* one **write-back thread** starts each written range's write-back (``start_writeback``), so the
  fsync before the rename has little left and a blocked queue holds back no request.

Parts fetched and not yet written are held in memory: at most ``max_workers`` +
``_WAITING_PARTS`` at once.

An object may be fetched **in part** (``ranges``: the byte ranges a node's ranks read of another
rank's DCP file, :mod:`trainer_client.restart.node_share`): its file is created at its full
size (sparse) and only those ranges are written, each at its own offset, so DCP's reader finds
every item where ``.metadata`` says it is. Such an object is checked by the length of every range
(the GETs name the pinned version, which the node owning the file hashes in full); a whole one by
size and SHA-256. ``preloaded`` bytes (a ``.metadata`` already fetched and verified) are written
without a request, and so is a part of a ranged object that ``relayed`` holds whole (the bytes
rank 0 fetched once for every node, :mod:`trainer_client.restart.relay`).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_client.storage.durable import fsync_dir, start_writeback
from trainer_client.storage.exceptions import RestoreError, client_error_text
from trainer_client.storage.uri import CheckpointUri

if TYPE_CHECKING:
    from trainer_client.storage.restore import RemoteObject

# Parts held in memory waiting for an earlier part of their object, beyond those in flight: 16
# of 8 MiB is 128 MiB, plus 16 in flight, 256 MiB in all, about boto3 TransferManager's own
# bound on buffered download chunks (max_in_memory_download_chunks, 1,000 of 256 KiB). With 4
# spare slots, a slow part's successors filled them and every worker idled until it came.
_WAITING_PARTS = 16


@dataclass
class FetchTrace:
    """What one download did: seconds and threads per activity ("get": a ranged GET with its
    body; "write", "hash", "writeback"; "wait": the submitter waiting for a free slot; "fsync":
    the files' and directories' fsyncs after the last part), the requests made, and the GET
    phase's span. For the bench's breakdown and the tests."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    threads: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    requests: int = 0
    first_get: float | None = None
    last_get: float | None = None
    # Bytes written so far (read without the lock by a progress line: an int, one writer per
    # object adding to it under the lock).
    written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @contextlib.contextmanager
    def timed(self, activity: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._lock:
                self.seconds[activity] += end - start
                self.threads[activity].add(threading.current_thread().name)
                if activity == "get":
                    self.requests += 1
                    self.first_get = start if self.first_get is None else min(self.first_get, start)
                    self.last_get = end if self.last_get is None else max(self.last_get, end)

    def add_written(self, size: int) -> None:
        with self._lock:
            self.written += size

    def mean_in_flight(self) -> float:
        """Requests in flight on average from the first GET's start to the last one's end."""
        if self.first_get is None or self.last_get is None or self.last_get <= self.first_get:
            return 0.0
        return self.seconds["get"] / (self.last_get - self.first_get)


@dataclass
class _Object:
    """One object being restored: its file, and the parts waiting to be written and hashed."""

    remote: RemoteObject
    fd: int
    # (offset, length) of each part, in order; one object's parts cover it whole unless ``ranged``.
    spans: list[tuple[int, int]]
    ranged: bool = False
    preloaded: bytes | None = None
    # Ranges of the object already in memory ((offset, bytes), sorted), handed on by rank 0
    # (trainer_client/restart/relay.py): a part one of them holds whole is written without a GET.
    relayed: tuple[tuple[int, bytes], ...] = ()
    relayed_bytes: int = 0
    next_part: int = 0
    received: int = 0
    waiting: dict[int, bytes] = field(default_factory=dict)
    # An ordered thread is taking this object's parts: arrivals wait in ``waiting`` for it.
    draining: bool = False
    digest: Any = field(default_factory=hashlib.sha256)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def parts(self) -> int:
        return len(self.spans)


def spans_of(
    size: int, part_bytes: int, ranges: Sequence[tuple[int, int]] | None
) -> list[tuple[int, int]]:
    """The parts of an object of ``size`` B: the whole object (one empty part for an empty one),
    or only ``ranges`` ((offset, length), sorted, disjoint), each cut at ``part_bytes``."""
    spans: list[tuple[int, int]] = []
    for offset, length in [(0, size)] if ranges is None else ranges:
        if offset < 0 or length < 0 or offset + length > size:
            raise RestoreError("ranges", f"({offset}, {length}) is outside an object of {size} B")
        spans += [
            (o, min(part_bytes, offset + length - o))
            for o in range(offset, offset + length, part_bytes)
        ]
    return spans or [(0, 0)]


def _interleaved(states: Sequence[_Object]) -> Iterator[tuple[_Object, int]]:
    """Every part of every object, the objects taken in turn (part 0 of each, then part 1, …):
    the parts waiting to be hashed belong to many objects, whose digests advance side by side
    on several cores instead of one object's parts queueing behind one digest."""
    for index in range(max(state.parts for state in states)):
        for state in states:
            if index < state.parts:
                yield state, index


class _Download:
    """One download's shared state: the slots, the first failure, the three kinds of thread."""

    def __init__(
        self, client: Any, part_bytes: int, max_workers: int, objects: int, trace: FetchTrace
    ) -> None:
        self.client = client
        self.part_bytes = part_bytes
        self.trace = trace
        self.slots = threading.BoundedSemaphore(max_workers + _WAITING_PARTS)
        self.failed = threading.Event()
        self.error: BaseException | None = None
        self.gets = ThreadPoolExecutor(max_workers, thread_name_prefix="restore-get")
        ordered = max(1, min(objects, os.cpu_count() or 1, max_workers))
        self.ordered = ThreadPoolExecutor(ordered, thread_name_prefix="restore-write")
        self.writeback = ThreadPoolExecutor(1, thread_name_prefix="restore-writeback")

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.failed.set()

    def submit(self, pool: ThreadPoolExecutor, fn: Callable[..., None], *args: Any) -> None:
        def guarded() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # handed to the submitting thread, raised there
                self.fail(exc)

        pool.submit(guarded)

    def run(self, states: Sequence[_Object]) -> None:
        try:
            for state, index in _interleaved(states):
                with self.trace.timed("wait"):
                    while not self.slots.acquire(timeout=0.5) and not self.failed.is_set():
                        pass
                if self.failed.is_set():
                    break
                self.submit(self.gets, self.get_part, state, index)
        finally:
            # GETs first: they hand parts to the ordered threads, which hand ranges to write-back.
            for pool in (self.gets, self.ordered, self.writeback):
                pool.shutdown(wait=True, cancel_futures=self.failed.is_set())
        if self.error is not None:
            raise self.error

    def get_part(self, state: _Object, index: int) -> None:
        if self.failed.is_set():
            self.slots.release()
            return
        remote = state.remote
        start, expected = state.spans[index]
        end = start + expected - 1
        try:
            if state.preloaded is not None:
                data = state.preloaded[start : end + 1]
            elif (kept := held(state.relayed, start, expected)) is not None:
                data = kept
                with state.lock:
                    state.relayed_bytes += expected
            elif expected:
                with self.trace.timed("get"):
                    data = get_range(self.client, remote, start, end)
            else:
                data = b""
            if len(data) != expected:
                raise RestoreError(
                    "bytes",
                    f"{remote.uri}: part at {start} has {len(data)} B, expected {expected} B",
                )
        except BaseException:
            self.slots.release()
            raise
        with state.lock:
            state.waiting[index] = data
            if state.draining:
                return  # the object's ordered thread takes this part when its turn comes
            state.draining = True
        self.submit(self.ordered, self.drain, state)

    def drain(self, state: _Object) -> None:
        """Write and hash the object's parts that are next in order (outside the lock, so GET
        threads handing over parts never wait for it) until the next one has not arrived."""
        while True:
            with state.lock:
                chunk = state.waiting.pop(state.next_part, None)
                if chunk is None or self.failed.is_set():
                    state.draining = False
                    return
                index = state.next_part
                state.next_part += 1
            try:
                if chunk:
                    offset = state.spans[index][0]
                    with self.trace.timed("write"):
                        os.pwrite(state.fd, chunk, offset)
                    self.submit(self.writeback, self.start_writeback, state.fd, offset, len(chunk))
                    if not state.ranged:
                        with self.trace.timed("hash"):
                            state.digest.update(chunk)  # releases the GIL for large buffers
                state.received += len(chunk)  # only the object's one ordered thread writes it
                self.trace.add_written(len(chunk))
            finally:
                self.slots.release()

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        if not self.failed.is_set():
            with self.trace.timed("writeback"):
                start_writeback(fd, offset, length)


def fetch_all(
    objects: Sequence[RemoteObject],
    target: Path,
    client: Any,
    max_workers: int,
    part_bytes: int,
    *,
    single: bool,
    trace: FetchTrace | None = None,
    ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    preloaded: Mapping[str, bytes] | None = None,
    relayed: Mapping[str, Sequence[tuple[int, bytes]]] | None = None,
) -> int:
    """Download ``objects`` into ``target`` (a file when ``single``), each verified by size and
    SHA-256 (those in ``ranges``: only those byte ranges, each by its length), every file and
    directory fsynced; the bytes fetched (``preloaded`` and ``relayed`` ones excluded)."""
    ranges = ranges or {}
    preloaded = preloaded or {}
    relayed = relayed or {}
    states = []
    try:
        for obj in objects:
            path = target if single else target / obj.relative
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            part = ranges.get(obj.relative)
            loaded = preloaded.get(obj.relative) if part is None else None
            states.append(
                _Object(
                    obj,
                    fd,
                    spans_of(obj.bytes, part_bytes, part),
                    part is not None,
                    loaded,
                    tuple(sorted(relayed.get(obj.relative, ()))) if part is not None else (),
                )
            )
            os.ftruncate(fd, obj.bytes)
        trace = trace or FetchTrace()
        _Download(client, part_bytes, max_workers, len(states), trace).run(states)
        total = 0
        with trace.timed("fsync"):
            for state in states:
                _check_done(state)
                # Durable before the rename: the write-back started part by part, so this mostly
                # waits for what is still in flight.
                os.fsync(state.fd)
                if state.preloaded is None:
                    total += state.received - state.relayed_bytes
            for directory in sorted({target.parent if single else target} | _dirs(target, states)):
                fsync_dir(directory)
        return total
    finally:
        for state in states:
            with contextlib.suppress(OSError):
                os.close(state.fd)


def held(relayed: Sequence[tuple[int, bytes]], start: int, length: int) -> bytes | None:
    """The bytes at ``start`` of ``length`` when one relayed range holds them whole."""
    at = bisect.bisect_right(relayed, start, key=lambda piece: piece[0]) - 1
    if length and at >= 0:
        offset, data = relayed[at]
        if start + length <= offset + len(data):
            return data[start - offset : start - offset + length]
    return None


def _dirs(target: Path, states: Sequence[_Object]) -> set[Path]:
    out: set[Path] = set()
    for state in states:
        parent = (target / state.remote.relative).parent if state.remote.relative else target
        while parent != target and target in parent.parents:
            out.add(parent)
            parent = parent.parent
    return out


def get_range(client: Any, remote: RemoteObject, start: int, end: int) -> bytes:
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
        raise RestoreError("uri", f"{remote.uri}: {client_error_text(exc)}") from None
    except BotoCoreError as exc:
        raise RestoreError("uri", f"{remote.uri}: {exc}") from None


def _check_done(state: _Object) -> None:
    remote = state.remote
    wanted = sum(length for _, length in state.spans) if state.ranged else remote.bytes
    if state.next_part != state.parts or state.received != wanted:
        raise RestoreError(
            "bytes", f"{remote.uri}: received {state.received} B, expected {wanted} B"
        )
    if state.ranged:
        return  # its version is pinned; the node that owns the file hashes it whole
    digest = state.digest.hexdigest()
    if remote.sha256 is not None and digest != remote.sha256:
        raise RestoreError("sha256", f"{remote.uri}: sha256 {digest}, reported {remote.sha256}")
