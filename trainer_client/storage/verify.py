"""Is a reported checkpoint still in its store, as reported? One bounded, concurrent pass.

What each stored shard row lets a reader expect (:func:`expectations`, pure, in
:mod:`trainer_client.storage.verify_rules`):

* its pinned objects (``training_checkpoint_shards.objects``, or ``extra->'objects'`` from the
  previous release's writer; ``ckpt_contract/objects.py``): every object, with its size and pins;
* otherwise, a directory with the files it listed (``extra.files``, the Hugging Face callback):
  each file exists, its ``extra.file_sha256`` digest where one was sent;
* otherwise its ``uri`` as one object of ``bytes`` with ``sha256``.

How the ``s3://`` objects are checked (:func:`verify_objects`, the I/O), by default: a listing
of their keys (:mod:`trainer_client.storage.verify_listing`: one ``ListObjectsV2`` per
1,000 keys, concurrently; ``ListObjectVersions`` where a pin names a version) decides every
object it shows as reported (size; the pinned VersionId, else the pinned ETag); the rest get
one ``HeadObject(ChecksumMode=ENABLED)`` each: those the listing shows missing or different
(the HEAD confirms and names the difference), a checksum-only pin, and an unpinned object
whose store keeps a full-object SHA-256 to compare with the reported ``sha256``
(:func:`~trainer_client.storage.verify_rules.listing_decides`; what each proves:
docs/DESIGN.md, "Verification by listing"). ``verify_by="head"`` HEADs every object (the key
as it is now: a resume loads the key, not a version): it must exist; its size must be the
reported one; the checksum of the pinned algorithm must be the pinned value, the ETag and
VersionId the pinned ones, and a full-object ``ChecksumSHA256`` the reported ``sha256`` (a
composite one, of a multipart upload, describes the parts and is not compared). On
``file://`` the size. The opt-in deep check HEADs, then reads every object and hashes it
(against ``sha256``; and its size, which catches a store that answers metadata it does not
hold). Requests run concurrently on one client, at most ``max_workers`` at a time (fewer
where the client's connection pool is smaller).

A store that cannot answer (no permission, unreachable) raises :class:`VerifyError`: "cannot
check" is not "damaged", and skipping every checkpoint on a missing permission would silently
resume from scratch.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from trainer_client.storage.durable import sha256_file
from trainer_client.storage.exceptions import VerifyError, client_error_text
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify_listing import (
    LIST_WORKERS,
    StoreListing,
    list_expected,
    list_prefix,
    list_spread,
)
from trainer_client.storage.verify_rules import (
    LIST_PAGE,
    Expected,
    Listed,
    ShardRecord,
    b64_of_hex,
    compare_head,
    expectations,
    listing_decides,
)

__all__ = [
    "LIST_PAGE",
    "LIST_WORKERS",
    "VERIFY_BY",
    "VERIFY_MAX_WORKERS",
    "Difference",
    "Expected",
    "Listed",
    "ShardRecord",
    "StoreListing",
    "Verification",
    "VerifyBy",
    "VerifyError",
    "b64_of_hex",
    "compare_head",
    "expectations",
    "list_prefix",
    "list_spread",
    "s3_client_for",
    "verify_objects",
]

_log = logging.getLogger(__name__)

# "listing": list the objects, HEAD only what the listing cannot decide; "head": HEAD each one.
VerifyBy = Literal["listing", "head"]
VERIFY_BY: tuple[VerifyBy, ...] = get_args(VerifyBy)
# Clients already warned about a connection pool smaller than the workers (once a client).
_WARNED_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()

# Concurrent HEADs per checkpoint. S3 serves thousands of requests per second per prefix; the
# limit is the client's own connection pool and threads.
VERIFY_MAX_WORKERS = 64
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Difference:
    """One object that is not as reported, and what differed."""

    uri: str
    what: str

    def __str__(self) -> str:
        return f"{self.uri}: {self.what}"


@dataclass
class Verification:
    """The outcome for one checkpoint: the differences found (empty: intact), objects checked."""

    checked: int = 0
    differences: list[Difference] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        """One line: the first difference, and how many more."""
        if self.intact:
            return f"{self.checked} objects as reported"
        first = self.differences[0]
        more = len(self.differences) - 1
        return str(first) + (f" (and {more} more)" if more else "")


# -- asking the store ------------------------------------------------------------------------------


def verify_objects(
    expected: Sequence[Expected],
    *,
    deep: bool = False,
    s3_client: Any = None,
    max_workers: int = VERIFY_MAX_WORKERS,
    stop_at_first: bool = True,
    verify_by: VerifyBy = "listing",
    listing: StoreListing | None = None,
    list_workers: int = LIST_WORKERS,
) -> Verification:
    """Check every object; see the module docstring.

    ``verify_by="listing"`` (the default) lists the ``s3://`` objects (or takes them from
    ``listing``, a listing the caller made of the whole store) and HEADs only those the listing
    cannot decide; ``"head"`` HEADs every object. ``deep`` reads every object (after its HEAD).
    At most ``max_workers`` requests at once (fewer when ``s3_client``'s connection pool is
    smaller: one warning), of them at most ``list_workers`` listings (a page's parse holds the
    client's one interpreter: :data:`LIST_WORKERS`). With ``stop_at_first`` the pass stops
    starting checks once one object differs (a resume only needs to know that the checkpoint is
    damaged).
    """
    if max_workers < 1:
        raise VerifyError("max_workers", "must be at least 1")
    if list_workers < 1:
        raise VerifyError("list_workers", "must be at least 1")
    if verify_by not in VERIFY_BY:
        raise VerifyError("verify_by", f"must be one of {', '.join(VERIFY_BY)}")
    result = Verification()
    if not expected:
        return result
    client = s3_client
    if client is None and any(e.uri.startswith("s3://") for e in expected):
        client = s3_client_for(max_workers, parse_timestamps=False)
    workers = _pool_workers(client, max_workers)
    to_head = list(range(len(expected)))
    if verify_by == "listing" and not deep:
        seen = _listing_entries(
            expected, listing, client=client, workers=min(workers, list_workers)
        )
        to_head = [
            i
            for i, item in enumerate(expected)
            if item.uri not in seen or not listing_decides(item, seen[item.uri])
        ]
    found, headed = _head_each(
        [expected[i] for i in to_head],
        deep=deep,
        client=client,
        workers=workers,
        stop_at_first=stop_at_first,
    )
    result.checked = len(expected) - len(to_head) + headed
    result.differences = [found[i] for i in sorted(found)]
    return result


def _listing_entries(
    expected: Sequence[Expected], listing: StoreListing | None, *, client: Any, workers: int
) -> dict[str, Listed | None]:
    """The listing entry (None: missing) of every listable object, from the caller's listing
    where it covers the object, else from listing what is left."""
    listable = [e for e in expected if e.uri.startswith("s3://") and not e.directory]
    seen: dict[str, Listed | None] = {}
    rest = []
    for item in listable:
        if listing is not None and listing.covers(item.uri):
            seen[item.uri] = listing.objects.get(item.uri)
        else:
            rest.append(item)
    if rest:
        seen.update(list_expected(rest, client=client, workers=workers))
    return seen


def _pool_workers(client: Any, max_workers: int) -> int:
    """``max_workers``, or the client's connection pool where it is smaller (boto3's default is
    10): more threads than connections only open and drop connections. Warned once a client."""
    config = getattr(getattr(client, "meta", None), "config", None)
    pool = getattr(config, "max_pool_connections", None)
    if not isinstance(pool, int) or pool >= max_workers:
        return max_workers
    if client not in _WARNED_POOLS:
        _WARNED_POOLS.add(client)
        _log.warning(
            "the S3 client's connection pool (max_pool_connections=%d) is smaller than"
            " max_workers=%d: verifying %d at a time; give the client"
            " botocore.config.Config(max_pool_connections=%d) for more",
            pool,
            max_workers,
            pool,
            max_workers,
        )
    return pool


def _head_each(
    expected: Sequence[Expected], *, deep: bool, client: Any, workers: int, stop_at_first: bool
) -> tuple[dict[int, Difference], int]:
    """HEAD (and with ``deep`` read) each object, at most ``workers`` at once: the differences
    by index, and how many were checked."""
    found: dict[int, Difference] = {}
    checked = 0
    if not expected:
        return found, checked
    with ThreadPoolExecutor(max_workers=min(workers, len(expected))) as pool:
        pending: dict[Future[str | None], int] = {}
        queue = iter(enumerate(expected))

        def start(n: int) -> None:
            for index, item in queue:
                pending[pool.submit(_check, item, deep=deep, client=client)] = index
                n -= 1
                if n == 0:
                    return

        start(min(workers, len(expected)) * 2)
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                what = future.result()  # VerifyError propagates: nothing decided
                checked += 1
                if what is not None:
                    found[index] = Difference(expected[index].uri, what)
            if not (found and stop_at_first):
                start(len(done))
    return found, checked


def s3_client_for(max_workers: int, *, parse_timestamps: bool = True) -> Any:
    """A boto3 S3 client whose connection pool fits ``max_workers`` concurrent requests.

    ``parse_timestamps=False``: its answers keep timestamps (``LastModified``) as S3's text.
    botocore parses each with dateutil, ~50 of the ~65 µs of client CPU per key of a
    ``ListObjectsV2`` page (``python -m bench read_paths --pages``); nothing that verifies,
    restores or looks for newer checkpoints reads one. Set through botocore's own hook,
    ``ResponseParserFactory.set_parser_defaults`` of this client's session only (the AWS CLI
    does the same for its listings), not a parser of ours.
    """
    import boto3
    import botocore.session
    from botocore.config import Config

    core = botocore.session.get_session()
    if not parse_timestamps:
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return boto3.session.Session(botocore_session=core).client(
        "s3",
        config=Config(max_pool_connections=max_workers, retries={"mode": "standard"}),
    )


def _check(expected: Expected, *, deep: bool, client: Any) -> str | None:
    parsed = CheckpointUri.parse(expected.uri)
    if parsed.scheme == "s3":
        return _check_s3(expected, parsed.bucket, parsed.key, deep=deep, client=client)
    if parsed.scheme in ("file", ""):
        return _check_file(expected, parsed.local_path, deep=deep)
    raise VerifyError("uri", f"{expected.uri}: no check for the {parsed.scheme!r} scheme")


def _check_file(expected: Expected, path: Path, *, deep: bool) -> str | None:
    try:
        if expected.directory:
            return None if path.is_dir() else "missing"
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise VerifyError("uri", f"{expected.uri}: {exc.strerror}") from None
    if expected.bytes is not None and size != expected.bytes:
        return f"size {size} B, reported {expected.bytes} B"
    if deep and expected.sha256 is not None:
        digest = sha256_file(path)
        if digest != expected.sha256:
            return f"sha256 {digest}, reported {expected.sha256}"
    return None


def _check_s3(expected: Expected, bucket: str, key: str, *, deep: bool, client: Any) -> str | None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if expected.directory:
            listed = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
            return None if listed.get("KeyCount", 0) else "missing (no object under the prefix)"
        try:
            head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchKey", "NotFound"):
                return "missing"
            # S3 answers 403 for a missing key unless s3:ListBucket is granted, which a
            # least-privilege role may have only under its prefix (an s3:prefix condition a
            # HEAD does not carry): a listing of exactly this key tells (or raises 403 too).
            if code in ("403", "AccessDenied") and not _listed(client, bucket, key):
                return "missing"
            raise
        what = compare_head(expected, head)
        if what is not None or not deep:
            return what
        return _deep_s3(expected, bucket, key, client)
    except ClientError as exc:
        raise VerifyError("uri", f"{expected.uri}: {client_error_text(exc)}") from None
    except BotoCoreError as exc:
        raise VerifyError("uri", f"{expected.uri}: {exc}") from None


def _listed(client: Any, bucket: str, key: str) -> bool:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    return any(item.get("Key") == key for item in listed.get("Contents", []))


def _deep_s3(expected: Expected, bucket: str, key: str, client: Any) -> str | None:
    extra = (
        {"VersionId": expected.pin.version_id} if expected.pin and expected.pin.version_id else {}
    )
    body = client.get_object(Bucket=bucket, Key=key, **extra)["Body"]
    digest, size = hashlib.sha256(), 0
    for chunk in body.iter_chunks(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    if expected.bytes is not None and size != expected.bytes:
        return f"read {size} B, reported {expected.bytes} B"
    if expected.sha256 is not None and digest.hexdigest() != expected.sha256:
        return f"sha256 {digest.hexdigest()}, reported {expected.sha256}"
    return None
