"""Pins of the stored objects a report describes: which bytes, exactly, a shard's report is about.

A report's ``uri`` says where a shard lives; its optional ``objects`` list pins every object the
shard consists of (one for a ``.pt`` file, one per file of an uploaded directory) as the store
answered at the end of the write: size, the checksum the store keeps (algorithm, value and
type), the ETag and, in a versioned bucket, the VersionId. A reader compares what the store says
now with these pins (``trainer_client.storage.verify``), so a deleted, truncated or
replaced object is found without reading it.

What each pin can prove (docs/DESIGN.md, "Pinned objects"):

* ``sha256`` is the client's own hash of the whole object, computed while it was written or
  uploaded. S3 cannot give a full-object SHA-256 of a multipart object (only a composite one,
  ``…-N``), so this is the one digest that always describes the content.
* ``checksum_algorithm`` + ``checksum`` (+ ``checksum_type``) are what S3 stored and returns on
  ``HeadObject(ChecksumMode=ENABLED)``: the same algorithm and value now means the same bytes.
* ``etag`` is an opaque version token (MD5 only for single-part uploads without SSE-KMS), never
  used as a content hash: a different ETag now means a different write.
* ``version_id``: a later write to the same key in a versioned bucket gets a new one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

# S3's checksum algorithms
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html).
ChecksumAlgorithm = Literal["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]
ChecksumType = Literal["FULL_OBJECT", "COMPOSITE"]
# One report's objects: far more than a rank writes (an HF checkpoint directory has ~10 files);
# the 64 KiB body limit binds first (~200 pinned objects of 300 B each).
MAX_OBJECTS = 1024
# Base64 of a digest, and S3's composite form "<base64>-<parts>".
_CHECKSUM_PATTERN = r"^[A-Za-z0-9+/]{4,88}={0,2}(-[0-9]{1,5})?$"
# S3 ETags are quoted hex (+ "-N"); other stores' tokens are printable ASCII too.
_ETAG_PATTERN = r"^[\x21-\x7e]{1,128}$"
_VERSION_PATTERN = r"^[\x21-\x7e]{1,1024}$"
# PostgreSQL's bigint, the column type of every integer the writer stores (sizes here, steps
# and counts in the report): a larger value is NumericValueOutOfRange there: refused at the call.
INT64_MAX = 2**63 - 1


class StoredObject(BaseModel):
    """One object of a shard as the store answered after the write completed.

    Strict and closed (``extra="forbid"``): a pin nobody checks would be a false promise, so a
    new kind of pin is a change of this model, not a silently kept field.
    """

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    bytes: Annotated[int, Field(ge=0, le=INT64_MAX)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    checksum_algorithm: ChecksumAlgorithm | None = None
    checksum: Annotated[str, StringConstraints(pattern=_CHECKSUM_PATTERN)] | None = None
    checksum_type: ChecksumType | None = None
    etag: Annotated[str, StringConstraints(pattern=_ETAG_PATTERN)] | None = None
    version_id: Annotated[str, StringConstraints(pattern=_VERSION_PATTERN)] | None = None

    @model_validator(mode="after")
    def _checksum_with_its_algorithm(self) -> Self:
        if (self.checksum is None) != (self.checksum_algorithm is None):
            raise ValueError("checksum and checksum_algorithm go together")
        if self.checksum_type is not None and self.checksum is None:
            raise ValueError("checksum_type needs a checksum")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_pins(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An absent pin is left out rather than sent as null: ~20 bytes per pin and object
        # against the body's 64 KiB.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def full_object_checksum(self) -> bool:
        """Whether ``checksum`` is of the whole object (comparable with a digest of its bytes)."""
        if self.checksum is None:
            return False
        if self.checksum_type is not None:
            return self.checksum_type == "FULL_OBJECT"
        # Without the type: a composite value carries its part count (S3 says so on
        # GetObjectAttributes; moto does not add it on HeadObject, see S3-NOTES).
        return "-" not in self.checksum and not _multipart_etag(self.etag)


def _multipart_etag(etag: str | None) -> bool:
    return etag is not None and "-" in etag.strip('"')


def objects_total_bytes(objects: list[StoredObject]) -> int:
    """The sum of the objects' sizes: what the report's ``bytes`` must say when both are given."""
    return sum(o.bytes for o in objects)
