"""Listing the objects a verification expects: one request per 1,000 keys, ranges concurrently.

The expected keys of a bucket, sorted, are cut into ranges of :data:`LIST_PAGE` keys
(:func:`~trainer_client.storage.verify_rules.key_ranges`); each range is one
``ListObjectsV2`` (``Prefix`` = the range's common prefix, ``StartAfter`` = the key before it)
that returns exactly its keys when nothing else lies between them, so a 100,000-shard
checkpoint is ~100 requests, run concurrently, whatever its layout. Where a pin names a
``VersionId`` the bucket is listed with ``ListObjectVersions`` (``KeyMarker`` instead of
``StartAfter``), which names each key's current version. Foreign keys inside a range only cost
more pages.

The callers list at most :data:`LIST_WORKERS` ranges at once, whatever they allow the HEADs:
each page costs the client's one interpreter ~15-20 ms of parsing, so a few in flight keep it
busy, and more only make threads take turns at it and at the server.

A listing that is refused (``AccessDenied``: a role with ``s3:GetObject`` but no
``s3:ListBucket`` there) is not an error: that bucket's objects are HEADed instead, with one
warning. Anything else the store answers with an error raises :class:`VerifyError`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trainer_client.storage.exceptions import ListingRefused, VerifyError, client_error_text
from trainer_client.storage.s3_pins import split_s3_uri
from trainer_client.storage.uri import spread_of, spread_segments, unspread_uri
from trainer_client.storage.verify_rules import (
    LIST_PAGE,
    Expected,
    KeyRange,
    Listed,
    key_ranges,
)

_log = logging.getLogger(__name__)

# Listings in flight at once by default (verification's list_workers, reconcile). A 1,000-key
# page is ~15-20 ms of the client's CPU to parse (botocore, timestamps as text; python -m bench
# read_paths --pages), under the GIL: 8 in flight keep that one core busy while a page's round
# trip is up to ~8 of those, and more threads only take turns at it (and at an emulator's one
# process). At 100,000 shards on LocalStack, 1/2/4/8/16/64 at once took
# 12.0/13.6/10.8/9.6/10.7/12.3 s (and 8/16/64 11.5-11.8/10.1-12.3/13.1-14.2 s in a slower
# window), on moto 16-18 s for all
# (BENCHMARKS.md, "Read paths at 100,000 shards"). S3 itself was not measured (no account).
LIST_WORKERS = 8

_REFUSED = ("AccessDenied", "403")


@dataclass(frozen=True)
class StoreListing:
    """Every object one complete listing found under ``under`` (``s3://bucket/prefix``), by
    URI: a key under it that is not in ``objects`` is missing. Lets a caller that has listed
    the store already (``ckpt-pipeline reconcile``) verify from its own pass."""

    under: str
    objects: Mapping[str, Listed]
    # The hex digits of the spread the listing covered too (every ``<hex>/prefix``; 0: none).
    spread_width: int = 0

    def covers(self, uri: str) -> bool:
        if uri.startswith(self.under):
            return True
        unspread = unspread_uri(uri, self.spread_width) if self.spread_width else None
        return unspread is not None and unspread.startswith(self.under)


def list_expected(
    expected: Sequence[Expected], *, client: Any, workers: int, page: int = LIST_PAGE
) -> dict[str, Listed | None]:
    """Each expected ``s3://`` object's current listing entry by URI (None: not listed, i.e.
    missing). URIs of a bucket whose listing was refused are left out (HEAD them). ``page``:
    keys per range and per request (S3's most, :data:`LIST_PAGE`; smaller in tests)."""
    by_bucket: dict[str, dict[str, str]] = {}
    versioned: set[str] = set()
    for item in expected:
        bucket, key = split_s3_uri(item.uri)
        by_bucket.setdefault(bucket, {})[key] = item.uri
        if item.pin is not None and item.pin.version_id is not None:
            versioned.add(bucket)
    # Ranges never cross a key's first segment: keys spread over prefixes (``<hex>/…``,
    # storage/uri.py) are listed prefix by prefix, not across whatever else the bucket holds
    # between two of them.
    jobs = [
        (bucket, r, bucket in versioned)
        for bucket, keys in by_bucket.items()
        for group in _by_first_segment(keys).values()
        for r in key_ranges(group, per=page)
    ]
    refused: set[str] = set()
    found: dict[tuple[str, str], Listed] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        futures = [
            (b, pool.submit(_list_range, client, b, r, versions=v, page=page)) for b, r, v in jobs
        ]
        for bucket, future in futures:
            try:
                found.update(((bucket, listed.key), listed) for listed in future.result())
            except ListingRefused:
                refused.add(bucket)
    for bucket in sorted(refused):
        _log.warning(
            "listing s3://%s was refused (no s3:ListBucket?): verifying its objects by HEAD",
            bucket,
        )
    return {
        uri: found.get((bucket, key))
        for bucket, keys in by_bucket.items()
        if bucket not in refused
        for key, uri in keys.items()
    }


def _by_first_segment(keys: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.partition("/")[0], []).append(key)
    return groups


def list_spread(
    client: Any,
    bucket: str,
    prefix: str,
    *,
    width: int,
    split_after: Sequence[str] = (),
    workers: int = LIST_WORKERS,
    page: int = LIST_PAGE,
) -> list[tuple[str, dict[str, Any]]]:
    """Every object under ``s3://bucket/prefix`` and, with ``width`` (a spread's hex digits,
    storage/uri.py), under each ``<hex>/prefix``: (its key with the spread segment taken out,
    its ``ListObjectsV2`` entry). Each prefix is listed as disjoint key ranges cut after the
    ``split_after`` keys under it (:func:`list_prefix`), every range of every prefix ``workers``
    at a time."""
    prefixes = [prefix] + [f"{segment}/{prefix}" for segment in spread_segments(width)]
    groups = _by_first_segment(split_after)
    jobs: list[tuple[str, str | None, str | None]] = []
    for listed in prefixes:
        near = groups.get(listed.partition("/")[0], []) if "/" in listed else split_after
        bounds = sorted({k for k in near if k.startswith(listed)})
        jobs += [(listed, a, b) for a, b in zip([None, *bounds], [*bounds, None], strict=True)]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        found = list(pool.map(lambda j: (j[0], _list_between(client, bucket, *j, page=page)), jobs))
    result: list[tuple[str, dict[str, Any]]] = []
    for listed, items in found:
        for item in items:
            key = item["Key"]
            if listed != prefix:
                result.append((key.partition("/")[2], item))
            elif not (width and not prefix and spread_of(key, "") == width):
                result.append((key, item))  # (at the bucket's root: spread keys are listed apart)
    return result


def list_prefix(
    client: Any,
    bucket: str,
    prefix: str,
    *,
    split_after: Sequence[str],
    workers: int,
    page: int = LIST_PAGE,
) -> list[dict[str, Any]]:
    """Every object under ``s3://bucket/prefix`` (``ListObjectsV2``'s entries, in key order),
    listed as disjoint key ranges concurrently: up to and including ``split_after[0]``, then up
    to ``split_after[1]``, ..., then the rest. Keys the caller expects, every :data:`LIST_PAGE`-th
    (``ckpt-pipeline reconcile``: its rows' objects), make each range about one page; a range
    holding more (objects nobody reported) pages on. The ranges cover the whole prefix, so the
    result is the listing a serial pagination returns, ``workers`` ranges at a time (the
    unspread case of :func:`list_spread`)."""
    listed = list_spread(
        client, bucket, prefix, width=0, split_after=split_after, workers=workers, page=page
    )
    return [item for _key, item in listed]


def _list_between(
    client: Any, bucket: str, prefix: str, after: str | None, last: str | None, *, page: int
) -> list[dict[str, Any]]:
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page}
    if after is not None:
        request["StartAfter"] = after
    found: list[dict[str, Any]] = []
    while True:
        answer = client.list_objects_v2(**request)
        contents = answer.get("Contents", [])
        found.extend(item for item in contents if last is None or item["Key"] <= last)
        if (last is not None and contents and contents[-1]["Key"] >= last) or not answer.get(
            "IsTruncated"
        ):
            return found
        request["ContinuationToken"] = answer["NextContinuationToken"]


def _list_range(
    client: Any, bucket: str, keys: KeyRange, *, versions: bool, page: int
) -> list[Listed]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if versions:
            return _list_versions(client, bucket, keys, page)
        return _list_objects(client, bucket, keys, page)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") in _REFUSED:
            raise ListingRefused(bucket) from None
        if error.get("Code") == "NoSuchBucket":
            return []  # every object missing: the HEADs confirm and say so
        raise VerifyError("uri", f"s3://{bucket}/{keys.prefix}: {client_error_text(exc)}") from None
    except BotoCoreError as exc:
        raise VerifyError("uri", f"s3://{bucket}/{keys.prefix}: {exc}") from None


def _list_objects(client: Any, bucket: str, keys: KeyRange, page: int) -> list[Listed]:
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": keys.prefix, "MaxKeys": page}
    if keys.start_after is not None:
        request["StartAfter"] = keys.start_after
    found: list[Listed] = []
    while True:
        answer = client.list_objects_v2(**request)
        contents = answer.get("Contents", [])
        found.extend(
            Listed(
                item["Key"],
                int(item["Size"]),
                item.get("ETag"),
                None,
                tuple(item.get("ChecksumAlgorithm") or ()),
                item.get("ChecksumType"),
            )
            for item in contents
            if keys.holds(item["Key"])
        )
        done = contents and contents[-1]["Key"] >= keys.last
        if done or not answer.get("IsTruncated"):
            return found
        request["ContinuationToken"] = answer["NextContinuationToken"]


def _list_versions(client: Any, bucket: str, keys: KeyRange, page: int) -> list[Listed]:
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": keys.prefix, "MaxKeys": page}
    if keys.start_after is not None:
        request["KeyMarker"] = keys.start_after
    current: dict[str, Listed | None] = {}
    while True:
        answer = client.list_object_versions(**request)
        entries = answer.get("Versions", []) + answer.get("DeleteMarkers", [])
        for entry in entries:
            key = entry["Key"]
            if not entry.get("IsLatest") or not keys.holds(key):
                continue
            # A delete marker as the current version: the key is missing.
            current[key] = (
                Listed(
                    key,
                    int(entry["Size"]),
                    entry.get("ETag"),
                    entry.get("VersionId"),
                    tuple(entry.get("ChecksumAlgorithm") or ()),
                    entry.get("ChecksumType"),
                )
                if "Size" in entry
                else None
            )
        # Versions are listed key by key, the current one first: once the range's last key
        # appears, its current version has.
        done = any(e["Key"] >= keys.last for e in entries)
        if done or not answer.get("IsTruncated"):
            return [listed for listed in current.values() if listed is not None]
        request["KeyMarker"] = answer["NextKeyMarker"]
        if answer.get("NextVersionIdMarker"):
            request["VersionIdMarker"] = answer["NextVersionIdMarker"]
