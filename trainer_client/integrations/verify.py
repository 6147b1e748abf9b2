"""Is a reported checkpoint still in its store, as reported? One bounded, concurrent pass.

What each stored shard row lets a reader expect (:func:`expectations`, pure, in
:mod:`trainer_client.integrations.verify_rules`):

* its pinned objects (``training_checkpoint_shards.objects``, or ``extra->'objects'`` from the
  previous release's writer; ``ckpt_contract/objects.py``): every object, with its size and pins;
* otherwise, a directory with the files it listed (``extra.files``, the Hugging Face callback):
  each file exists, its ``extra.file_sha256`` digest where one was sent;
* otherwise its ``uri`` as one object of ``bytes`` with ``sha256``.

How an object is checked (:func:`verify_objects`, the I/O): on ``s3://`` one
``HeadObject(ChecksumMode=ENABLED)`` of the key as it is now (a resume loads the key, not a
version). It must exist; its size must be the reported one; and whenever something can tell,
its content must be the reported one: the checksum of the pinned algorithm must be the pinned
value, the ETag and VersionId the pinned ones, and a full-object ``ChecksumSHA256`` must be the
reported ``sha256`` (a composite one, of a multipart upload, describes the parts and is not
compared). On ``file://`` the size. The opt-in deep check reads every object and hashes it
(against ``sha256``; and its size, which catches a store that answers metadata it does not
hold). HEADs run concurrently on one client, at most ``max_workers`` at a time.

A store that cannot answer (no permission, unreachable) raises :class:`VerifyError`: "cannot
check" is not "damaged", and skipping every checkpoint on a missing permission would silently
resume from scratch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from trainer_client.durable import sha256_file
from trainer_client.integrations.exceptions import VerifyError
from trainer_client.integrations.verify_rules import (
    Expected,
    ShardRecord,
    b64_of_hex,
    compare_head,
    expectations,
)

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "Difference",
    "Expected",
    "ShardRecord",
    "Verification",
    "VerifyError",
    "b64_of_hex",
    "compare_head",
    "expectations",
    "s3_client_for",
    "verify_objects",
]

# Concurrent HEADs per checkpoint. S3 serves thousands of requests per second per prefix; the
# limit is the client's own connection pool and threads.
DEFAULT_MAX_WORKERS = 64
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
    max_workers: int = DEFAULT_MAX_WORKERS,
    stop_at_first: bool = True,
) -> Verification:
    """Check every object (concurrently, at most ``max_workers`` at once); see the docstring.

    With ``stop_at_first`` the pass stops starting checks once one object differs (a resume
    only needs to know that the checkpoint is damaged).
    """
    if max_workers < 1:
        raise VerifyError("max_workers", "must be at least 1")
    result = Verification()
    if not expected:
        return result
    client = s3_client
    if client is None and any(e.uri.startswith("s3://") for e in expected):
        client = s3_client_for(max_workers)
    found: dict[int, Difference] = {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(expected))) as pool:
        pending: dict[Future[str | None], int] = {}
        queue = iter(enumerate(expected))

        def start(n: int) -> None:
            for index, item in queue:
                pending[pool.submit(_check, item, deep=deep, client=client)] = index
                n -= 1
                if n == 0:
                    return

        start(min(max_workers, len(expected)) * 2)
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                what = future.result()  # VerifyError propagates: nothing decided
                result.checked += 1
                if what is not None:
                    found[index] = Difference(expected[index].uri, what)
            if not (found and stop_at_first):
                start(len(done))
    result.differences = [found[i] for i in sorted(found)]
    return result


def s3_client_for(max_workers: int) -> Any:
    """A boto3 S3 client whose connection pool fits ``max_workers`` concurrent requests."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        config=Config(max_pool_connections=max_workers, retries={"mode": "standard"}),
    )


def _check(expected: Expected, *, deep: bool, client: Any) -> str | None:
    parsed = urlparse(expected.uri)
    if parsed.scheme == "s3":
        return _check_s3(expected, parsed.netloc, parsed.path.lstrip("/"), deep=deep, client=client)
    if parsed.scheme in ("file", ""):
        return _check_file(expected, Path(unquote(parsed.path)), deep=deep)
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
        error = exc.response.get("Error", {})
        raise VerifyError(
            "uri", f"{expected.uri}: {error.get('Code')} {error.get('Message') or ''}".rstrip()
        ) from None
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
