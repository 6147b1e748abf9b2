"""Upload a local checkpoint (a file or a directory) to S3 and pin every object it wrote.

For each file: boto3's managed transfer (multipart above ``multipart_threshold``, parts uploaded
``max_concurrency`` at a time) with S3's SHA-256 checksum on every request, so S3 refuses a part
whose bytes changed on the way (``BadDigest``); the client's own SHA-256 of the whole file,
computed from the very bytes the transfer reads (S3 keeps only a composite SHA-256 of a
multipart object); then one ``HeadObject(ChecksumMode=ENABLED)`` of the result: its size must be
the file's and a full-object ``ChecksumSHA256`` must be the client's digest, or the upload
failed. What that HEAD answers is the pin (``ckpt_contract.StoredObject``) the report carries.

An upload killed part way (SIGKILL, preemption) leaves no object at the key: a multipart upload
becomes an object only at CompleteMultipartUpload. Its parts stay (and are billed) until aborted:
a retry of the same key aborts the key's open multipart uploads first, and a bucket lifecycle
rule (``AbortIncompleteMultipartUpload``) catches the rest. Nothing here reports: the caller
reports the returned pins, only after every object of the checkpoint returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_contract.objects import StoredObject
from trainer_client.storage.durable import sha256_file
from trainer_client.storage.exceptions import UploadError, client_error_text
from trainer_client.storage.s3_pins import pin_from_head, split_s3_uri
from trainer_client.storage.uri import check_spread, spread_key

MIB = 1024 * 1024
# S3 allows 10,000 parts; 5 MiB is its minimum part size (but the last).
_MAX_PARTS = 10_000
_MIN_PART = 5 * MIB


@dataclass(frozen=True)
class UploadSettings:
    """How files are uploaded; the defaults suit checkpoint files of MiBs to hundreds of GiBs."""

    multipart_threshold: int = 64 * MIB
    part_size: int = 32 * MIB
    max_concurrency: int = 8
    # Bytes per second for the whole transfer (None: unlimited): spares the training job's NIC.
    max_bandwidth: int | None = None
    # Each file's key under one of this many prefixes in front (``<hex>/<key>``, the hex from the
    # SHA-256 of the key: storage/uri.py's spread_key), so a restart's GETs spread over as many
    # S3 partitions. 0: keys as they are. 16, 256, 4,096 or 65,536 (docs/DESIGN.md, "S3 at
    # 100,000 ranks", says how many a restart needs).
    spread_prefixes: int = 0

    def __post_init__(self) -> None:
        for name in ("multipart_threshold", "part_size", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1")
        if self.part_size < _MIN_PART:
            raise ValueError(f"part_size: must be at least {_MIN_PART} (S3's minimum part)")
        if self.max_bandwidth is not None and self.max_bandwidth < 1:
            raise ValueError("max_bandwidth: must be at least 1 byte/s or None")
        check_spread(self.spread_prefixes, "spread_prefixes")

    def key_for(self, uri: str) -> str:
        """Where the file meant for ``uri`` (``s3://bucket/key``) is stored: ``uri`` itself, or
        with ``spread_prefixes`` its spread form ``s3://bucket/<hex>/key``."""
        bucket, key = split_s3_uri(uri)
        return f"s3://{bucket}/{spread_key(key, self.spread_prefixes)}"

    def part_size_for(self, size: int) -> int:
        """``part_size``, raised for a file that would need more than S3's 10,000 parts."""
        needed = -(-size // _MAX_PARTS)
        return max(self.part_size, -(-needed // MIB) * MIB)


class _HashingReader(io.RawIOBase):
    """A file read through once for the digest; re-reads (retries, botocore's own checksum
    pass over a small body) and seeks are allowed and hash nothing twice."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")
        self.digest = hashlib.sha256()
        self.hashed = 0  # bytes [0, hashed) are in the digest

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        start = self._file.tell()
        data = self._file.read(size)
        if start <= self.hashed < start + len(data):
            self.digest.update(memoryview(data)[self.hashed - start :])
            self.hashed = start + len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def checkpoint_files(source: Path) -> list[tuple[Path, str]]:
    """(file, path relative to the checkpoint) of a file or of every file under a directory."""
    if source.is_file():
        return [(source, source.name)]
    if not source.is_dir():
        raise UploadError(source.as_uri(), "no such file or directory")
    files = []
    for root, _dirs, names in os.walk(source):
        for name in names:
            path = Path(root) / name
            files.append((path, path.relative_to(source).as_posix()))
    return sorted(files, key=lambda item: item[1])


def destination_uris(
    source: Path, destination: str, spread_prefixes: int = 0
) -> Iterator[tuple[Path, str]]:
    """Each local file and its ``s3://`` URI: a file goes to ``destination`` itself, a
    directory's files under it (``destination/relative``); with ``spread_prefixes`` each of
    those keys behind its spread segment (``s3://bucket/<hex>/…``)."""
    split_s3_uri(destination)  # refuses anything but s3://bucket/key
    settings = UploadSettings(spread_prefixes=spread_prefixes)
    if source.is_file():
        yield source, settings.key_for(destination)
        return
    for path, relative in checkpoint_files(source):
        yield path, settings.key_for(posixpath.join(destination.rstrip("/"), relative))


def upload_checkpoint(
    source: Path,
    destination: str,
    *,
    client: Any,
    settings: UploadSettings | None = None,
    on_object: Callable[[StoredObject], None] | None = None,
) -> list[StoredObject]:
    """Upload ``source`` (file or directory) to ``destination``; the pins of every object.

    Raises :class:`UploadError` when an object is not stored as the file was, or the store
    refused it (after boto3's own retries).
    """
    settings = settings or UploadSettings()
    pins = []
    for path, uri in destination_uris(source, destination, settings.spread_prefixes):
        pin = upload_file(path, uri, client=client, settings=settings)
        if on_object is not None:
            on_object(pin)
        pins.append(pin)
    return pins


def upload_file(path: Path, uri: str, *, client: Any, settings: UploadSettings) -> StoredObject:
    """One file to one key: managed transfer with SHA-256, then the HEAD that pins it."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3_uri(uri)
    size = path.stat().st_size
    part = settings.part_size_for(size)
    config = TransferConfig(
        multipart_threshold=max(settings.multipart_threshold, _MIN_PART),
        multipart_chunksize=part,
        max_concurrency=settings.max_concurrency,
        max_bandwidth=settings.max_bandwidth,
        # Parts are read into memory before they are sent: bound that to a few per thread.
        max_io_queue=settings.max_concurrency * 2,
    )
    try:
        abort_open_uploads(client, bucket, key)
        reader = _HashingReader(path)
        try:
            client.upload_fileobj(
                reader, bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"}, Config=config
            )
            digest = reader.digest.hexdigest() if reader.hashed == size else sha256_file(path)
        finally:
            reader.close()
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise UploadError(uri, f"{error.get('Code')}: {error.get('Message')}") from exc
    except BotoCoreError as exc:
        raise UploadError(uri, str(exc)) from exc
    pin = pin_from_head(uri, head, sha256=digest)
    if pin.bytes != size:
        raise UploadError(uri, f"stored {pin.bytes} B of a {size} B file")
    if pin.checksum_algorithm == "SHA256" and pin.full_object_checksum:
        from trainer_client.storage.verify import b64_of_hex

        if pin.checksum is not None and pin.checksum.split("-")[0] != b64_of_hex(digest):
            raise UploadError(uri, "the stored SHA-256 is not the file's")
    return pin


def abort_open_uploads(client: Any, bucket: str, key: str) -> int:
    """Abort the multipart uploads still open for exactly ``key`` (a killed earlier attempt)."""
    aborted = 0
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key):
        for upload in page.get("Uploads", []):
            if upload["Key"] == key:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
                aborted += 1
    return aborted


# The key of the start-up write check, under the upload prefix: a multipart upload that is
# created and aborted at once, so that no object is ever written there.
WRITE_CHECK_KEY = ".ckpt-pipeline-write-check"


def check_writable(client: Any, prefix: str, *, spread_prefixes: int = 0) -> None:
    """Raise ``UploadError`` (S3's code and message) unless ``prefix`` can be uploaded to
    (with ``spread_prefixes``: its spread form, where the objects go; a role scoped to the
    prefix alone cannot write there).

    A write is the only check of the permission that the upload needs (``s3:PutObject``):
    HeadBucket asks ``s3:ListBucket`` on the bucket, which a role scoped to its prefix (the
    stack's trainer policy, docs/deploy.md) does not have. CreateMultipartUpload is a write that
    stores nothing; it answers 404 ``NoSuchBucket`` for a missing bucket and 403
    ``AccessDenied`` without the permission (or the bucket's KMS key). The upload it opens is
    aborted at once (``s3:AbortMultipartUpload``, which the upload needs too); one the abort
    leaves behind is removed by the bucket's ``AbortIncompleteMultipartUpload`` rule.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3_uri(posixpath.join(prefix.rstrip("/"), WRITE_CHECK_KEY))
    key = spread_key(key, spread_prefixes)
    uri = f"s3://{bucket}/{key}"
    try:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    except ClientError as exc:
        raise UploadError(uri, f"cannot be written: {client_error_text(exc)}") from None
    except BotoCoreError as exc:
        raise UploadError(uri, f"cannot be reached: {exc}") from None
    # Written, so writable; an upload the abort leaves open is the lifecycle rule's to remove.
    with contextlib.suppress(ClientError, BotoCoreError):
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
