"""The pin of an S3 object (``ckpt_contract.StoredObject``) from the store's own answer.

Read from ``HeadObject(ChecksumMode=ENABLED)`` after the write completed, not from the upload's
response: a managed multipart upload does not hand back its CompleteMultipartUpload answer, and
a HEAD is what a reader will compare with later, so the pin is exactly what the store says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ckpt_contract.objects import ChecksumAlgorithm, StoredObject
from trainer_client.storage.uri import CheckpointUri

# In the order S3 documents them; an object has at most one stored checksum.
CHECKSUM_ALGORITHMS: Final[tuple[ChecksumAlgorithm, ...]] = (
    "CRC64NVME",
    "CRC32",
    "CRC32C",
    "SHA1",
    "SHA256",
)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; ValueError naming the rule otherwise."""
    parsed = CheckpointUri.parse(uri)
    if parsed.scheme != "s3" or not parsed.bucket:
        raise ValueError(f"{uri!r} is not an s3://bucket/key URI")
    return parsed.bucket, parsed.key


def pin_from_head(uri: str, head: Mapping[str, Any], *, sha256: str | None = None) -> StoredObject:
    """The object at ``uri`` as ``head`` (a HeadObject answer with ChecksumMode=ENABLED) says."""
    algorithm = next((a for a in CHECKSUM_ALGORITHMS if head.get("Checksum" + a)), None)
    checksum = head.get("Checksum" + algorithm) if algorithm else None
    kind = head.get("ChecksumType")
    return StoredObject(
        uri=uri,
        bytes=int(head["ContentLength"]),
        sha256=sha256,
        checksum_algorithm=algorithm,
        checksum=checksum,
        checksum_type=kind if kind in ("FULL_OBJECT", "COMPOSITE") else None,
        etag=head.get("ETag"),
        version_id=head.get("VersionId") if head.get("VersionId") not in (None, "null") else None,
    )


def head_pin(client: Any, uri: str, *, sha256: str | None = None) -> StoredObject:
    """HEAD ``uri`` (checksum mode on) and pin what the store answers."""
    bucket, key = split_s3_uri(uri)
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return pin_from_head(uri, head, sha256=sha256)
