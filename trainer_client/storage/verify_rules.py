"""What a shard row lets a reader expect of the store, and how one HeadObject answer compares
(pure; the checks that ask the store are in :mod:`trainer_client.storage.verify`)."""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError

from ckpt_contract.objects import StoredObject
from trainer_client._gc import cycle_collection_paused
from trainer_client.storage.exceptions import VerifyError
from trainer_client.storage.uri import CheckpointUri


class ShardRecord(NamedTuple):
    """What the database holds of one shard, as the verification reads it."""

    rank: int
    uri: str
    bytes: int | None
    sha256: str | None
    objects: Sequence[Mapping[str, Any]] | None
    extra: Mapping[str, Any]


class Expected(NamedTuple):
    """One object as its report describes it.

    A named tuple, not a frozen dataclass: a 100,000-shard checkpoint makes 100,000 of them, and a
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost ~3x a tuple's
    (BENCHMARKS.md, "Read paths at 100,000 shards"). Immutable and hashable the same way."""

    uri: str
    bytes: int | None = None
    sha256: str | None = None
    pin: StoredObject | None = None
    # A directory reported without pins: it must exist (hold at least one object).
    directory: bool = False


# -- what to expect (pure) -------------------------------------------------------------------------

# Every pinned shard's pins of a checkpoint validated in one call into pydantic-core: the same
# StoredObject model and the same lax mode as one ``model_validate`` per pin, without a Python
# call per pin (BENCHMARKS.md, "Read paths at 100,000 shards").
_PIN_LISTS: TypeAdapter[list[list[StoredObject]]] = TypeAdapter(list[list[StoredObject]])


def expectations(shards: Iterable[ShardRecord]) -> list[Expected]:
    """Every object the shards' rows describe, each once (ranks reporting one file share it).

    Every pin is validated as a :class:`~ckpt_contract.objects.StoredObject` here, whoever
    wrote the row: the writer validated the report it came from, but a row of the previous
    release's writer (``extra->'objects'``) or one written by hand was not, and a pin read
    unvalidated would be compared as if it were one (a size as text differs from every
    listing: a false "damaged"). One unreadable pin raises :class:`VerifyError` naming its rank.
    """
    rows = list(shards)
    with cycle_collection_paused():
        pinned = [shard for shard in rows if shard.objects]
        pins = iter(_validated_pins(pinned))
        items: list[Expected] = []
        for shard in rows:
            if shard.objects:
                items.extend([Expected(p.uri, p.bytes, p.sha256, p) for p in next(pins)])
            else:
                items.extend(_unpinned_expectations(shard))
        return list(dict.fromkeys(items))


def _validated_pins(pinned: Sequence[ShardRecord]) -> list[list[StoredObject]]:
    try:
        return _PIN_LISTS.validate_python([shard.objects for shard in pinned], strict=False)
    except ValidationError as exc:
        shard = pinned[int(exc.errors()[0]["loc"][0])]
        # The message of that shard's own pins, as one model_validate per pin words it.
        try:
            for pin in shard.objects or ():
                StoredObject.model_validate(pin, strict=False)
        except ValidationError as own:
            exc = own
        raise VerifyError("objects", f"rank {shard.rank}: stored pins unreadable: {exc}") from None


def _unpinned_expectations(shard: ShardRecord) -> list[Expected]:
    files = shard.extra.get("files")
    if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
        digests = shard.extra.get("file_sha256")
        digests = digests if isinstance(digests, Mapping) else {}
        return [
            Expected(_join(shard.uri, name), None, _str_or_none(digests.get(name)))
            for name in files
        ]
    if shard.uri.endswith("/"):
        return [Expected(shard.uri, None, None, directory=True)]
    return [Expected(shard.uri, shard.bytes, shard.sha256)]


def _join(directory_uri: str, relative: str) -> str:
    parsed = CheckpointUri.parse(directory_uri)
    return parsed.with_path(posixpath.join(parsed.path.rstrip("/"), relative))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def b64_of_hex(hex_digest: str) -> str:
    """S3's form of a digest (base64 of the bytes) from its hex form."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode("ascii")


def compare_head(expected: Expected, head: Mapping[str, Any]) -> str | None:
    """What differs between ``expected`` and a ``HeadObject`` answer, or None (pure)."""
    size = head.get("ContentLength")
    if expected.bytes is not None and size != expected.bytes:
        return f"size {size} B, reported {expected.bytes} B"
    pin = expected.pin
    if pin is not None:
        if pin.version_id is not None and head.get("VersionId") != pin.version_id:
            return f"VersionId {head.get('VersionId')}, pinned {pin.version_id}"
        if pin.checksum_algorithm is not None and pin.checksum is not None:
            name = "Checksum" + pin.checksum_algorithm
            now = head.get(name)
            if now is None:
                return f"no {name} now, pinned {pin.checksum}"
            if _checksum_value(now) != _checksum_value(pin.checksum):
                return f"{name} {now}, pinned {pin.checksum}"
        if pin.etag is not None and head.get("ETag") != pin.etag:
            return f"ETag {head.get('ETag')}, pinned {pin.etag}"
    stored_sha = head.get("ChecksumSHA256")
    if (
        expected.sha256 is not None
        and stored_sha is not None
        and _full_object(head)
        and _checksum_value(stored_sha) != b64_of_hex(expected.sha256)
    ):
        return f"ChecksumSHA256 {stored_sha} is not the reported sha256 {expected.sha256}"
    return None


def _checksum_value(value: str) -> str:
    # S3 answers a composite checksum as "<base64>-<parts>"; moto without the suffix.
    return value.split("-", 1)[0]


def _full_object(head: Mapping[str, Any]) -> bool:
    kind = head.get("ChecksumType")
    if kind is not None:
        return bool(kind == "FULL_OBJECT")
    # Without the type (older S3 APIs, moto): a multipart object's ETag or checksum carries "-N".
    etag = str(head.get("ETag") or "")
    return "-" not in etag.strip('"') and "-" not in str(head.get("ChecksumSHA256") or "")


# -- what a listing proves (pure) ------------------------------------------------------------------

# ListObjectsV2 and ListObjectVersions answer at most 1,000 entries per request
# (https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html, MaxKeys).
LIST_PAGE = 1000


@dataclass(frozen=True)
class Listed:
    """One key as a listing reported it (the current version; ``version_id`` only from
    ``ListObjectVersions``)."""

    key: str
    size: int
    etag: str | None
    version_id: str | None = None
    checksum_algorithms: tuple[str, ...] = ()
    checksum_type: str | None = None


@dataclass(frozen=True)
class KeyRange:
    """The keys ``start_after < key <= last`` under ``prefix``: one listing, one page when the
    range holds at most :data:`LIST_PAGE` keys and nothing else lies between them."""

    prefix: str
    start_after: str | None
    last: str

    def holds(self, key: str) -> bool:
        return (self.start_after is None or key > self.start_after) and key <= self.last


def key_ranges(keys: Iterable[str], *, per: int = LIST_PAGE) -> list[KeyRange]:
    """Disjoint ranges covering ``keys`` (sorted as S3 lists them), ``per`` keys each, so they
    can be listed concurrently whatever the layout (a ``StartAfter`` each, not a sub-prefix)."""
    ordered = sorted(set(keys))  # code-point order is UTF-8 byte order, S3's listing order
    result = []
    for start in range(0, len(ordered), per):
        chunk = ordered[start : start + per]
        prefix = posixpath.commonprefix([chunk[0], chunk[-1]])
        result.append(KeyRange(prefix, ordered[start - 1] if start else None, chunk[-1]))
    return result


def listing_decides(expected: Expected, listed: Listed | None) -> bool:
    """Whether a listing shows ``expected`` as reported, with nothing a HEAD could add.

    False means "HEAD it": the listing shows it missing or different (the HEAD confirms and
    names the difference: a listing never declares damage on its own), or cannot compare what
    the report pinned. What a listing proves, and what only a HEAD or a read does:
    docs/DESIGN.md, "Verification by listing".
    """
    if listed is None or expected.directory:
        return False
    if expected.bytes is not None and listed.size != expected.bytes:
        return False
    pin = expected.pin
    if pin is not None and pin.version_id is not None:
        # A version never changes: the current one being the pinned one decides. (None from
        # ListObjectsV2, which names no version: HEAD.)
        return listed.version_id == pin.version_id
    if pin is not None and pin.etag is not None:
        # The current object is the pinned write: its checksum is the pinned one too.
        return listed.etag == pin.etag
    if pin is not None and pin.checksum is not None:
        return False  # a checksum-only pin: only HeadObject returns the value
    # Unpinned: a HEAD adds something only where S3 keeps a full-object SHA-256 to compare with
    # the reported sha256.
    return not (
        expected.sha256 is not None
        and "SHA256" in listed.checksum_algorithms
        and listed.checksum_type != "COMPOSITE"
    )
