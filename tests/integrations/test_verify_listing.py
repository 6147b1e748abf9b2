"""Verification by listing on moto's S3 server: the requests counted through botocore's events.

Every request the client sends passes ``before-send.s3``: the counts are what S3 would bill,
deterministic (the listing's pages and the HEADs of what it cannot decide), not timings.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.config import Config

from ckpt_contract import StoredObject
from trainer_client.storage.verify import (
    Expected,
    Listed,
    list_prefix,
    s3_client_for,
    verify_objects,
)
from trainer_client.storage.verify_listing import _list_range, list_expected
from trainer_client.storage.verify_rules import KeyRange, key_ranges, listing_decides

SIZE = 16


class Requests:
    """The S3 operations a client sent, by name, counted at ``before-send``."""

    def __init__(self, client: Any) -> None:
        self.sent: Counter[str] = Counter()
        client.meta.events.register("before-send.s3", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        self.sent[event_name.rsplit(".", 1)[-1]] += 1

    @property
    def total(self) -> int:
        return sum(self.sent.values())


@pytest.fixture
def client(moto_endpoint: str) -> Iterator[Any]:
    import boto3

    yield boto3.session.Session().client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(max_pool_connections=64),
    )


def put_shards(client: Any, bucket: str, keys: list[str], **extra: Any) -> list[Expected]:
    """Tiny objects, pinned from their PutObject answer (ETag; VersionId where versioned)."""

    def put(key: str) -> Expected:
        data = os.urandom(SIZE)
        answer = client.put_object(Bucket=bucket, Key=key, Body=data, **extra)
        uri = f"s3://{bucket}/{key}"
        pin = StoredObject(
            uri=uri, bytes=SIZE, etag=answer["ETag"], version_id=answer.get("VersionId")
        )
        return Expected(uri, SIZE, None, pin)

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(put, keys))


def dcp_keys(shards: int) -> list[str]:
    return [f"job/step-100/__{rank}_0.distcp" for rank in range(shards)] + [
        "job/step-100/.metadata"
    ]


@pytest.mark.slow
def test_a_checkpoint_is_verified_with_one_listing_per_1000_keys_and_damage_confirmed_by_heads(
    client: Any, s3_bucket: str
) -> None:
    # GIVEN a 2,100-shard DCP checkpoint (the 4,096-shard figure, 5 listings, is measured by
    # `python -m bench read_paths`: moto takes a minute to PUT them one by one) and a
    # neighbouring checkpoint in the same folder
    expected = put_shards(client, s3_bucket, dcp_keys(2100))
    put_shards(client, s3_bucket, [f"job/step-200/__{r}_0.distcp" for r in range(20)])
    requests = Requests(client)
    result = verify_objects(expected, s3_client=client, max_workers=16)
    # THEN 2,101 keys in ranges of 1,000: three ListObjectsV2 and no HEAD (the neighbour costs
    # nothing: a range stops at its last expected key)
    assert result.intact and result.checked == 2101
    assert requests.sent == Counter({"ListObjectsV2": 3})
    # WHEN one object is deleted, one truncated, one replaced by other bytes of the same length
    gone, short, other = (expected[i].uri.split("/", 3)[3] for i in (5, 1500, 2099))
    client.delete_object(Bucket=s3_bucket, Key=gone)
    client.put_object(Bucket=s3_bucket, Key=short, Body=b"x" * (SIZE - 1))
    client.put_object(Bucket=s3_bucket, Key=other, Body=os.urandom(SIZE))
    requests.sent.clear()
    result = verify_objects(expected, s3_client=client, stop_at_first=False)
    # THEN the three ranges again, and one HEAD per object the listing showed different, which
    # confirms it and names what differs
    assert requests.sent == Counter({"ListObjectsV2": 3, "HeadObject": 3})
    pinned = expected[2099].pin.etag if expected[2099].pin else None
    assert [str(d) for d in result.differences] == [
        f"s3://{s3_bucket}/{gone}: missing",
        f"s3://{s3_bucket}/{short}: size {SIZE - 1} B, reported {SIZE} B",
        f"s3://{s3_bucket}/{other}: ETag {_etag(client, s3_bucket, other)}, pinned {pinned}",
    ]


def _etag(client: Any, bucket: str, key: str) -> str:
    return str(client.head_object(Bucket=bucket, Key=key)["ETag"])


def test_a_client_that_leaves_timestamps_as_text_verifies_the_same(
    client: Any, s3_bucket: str
) -> None:
    # GIVEN a small checkpoint, one object of it truncated, and the client the helpers make for
    # themselves (botocore's parser keeps LastModified as S3's text: its dateutil parse was most
    # of the client's CPU per listed key)
    expected = put_shards(client, s3_bucket, dcp_keys(5))
    key = expected[2].uri.split("/", 3)[3]
    own = s3_client_for(8, parse_timestamps=False)
    answer = own.list_objects_v2(Bucket=s3_bucket)["Contents"][0]["LastModified"]
    assert isinstance(answer, str)
    assert not isinstance(
        client.list_objects_v2(Bucket=s3_bucket)["Contents"][0]["LastModified"], str
    )
    assert verify_objects(expected, s3_client=own).intact
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    # THEN it finds the damage as the default client does, and so does the helper's own client
    for result in (verify_objects(expected, s3_client=own), verify_objects(expected)):
        assert [str(d) for d in result.differences] == [
            f"{expected[2].uri}: size 1 B, reported {SIZE} B"
        ]


def test_a_rewritten_version_is_found_by_listing_the_versions(
    client: Any, versioned_bucket: str
) -> None:
    expected = put_shards(client, versioned_bucket, dcp_keys(8))
    requests = Requests(client)
    assert verify_objects(expected, s3_client=client).intact
    assert requests.sent == Counter({"ListObjectVersions": 1})
    # WHEN rank 3 is written again (a new version; same size) THEN the listing's current
    # version is not the pinned one, and the HEAD confirms it
    key = expected[3].uri.split("/", 3)[3]
    client.put_object(Bucket=versioned_bucket, Key=key, Body=os.urandom(SIZE))
    requests.sent.clear()
    result = verify_objects(expected, s3_client=client)
    assert "VersionId" in result.summary() and key in result.summary()
    assert requests.sent == Counter({"ListObjectVersions": 1, "HeadObject": 1})
    # WHEN the key's current version is a delete marker THEN missing
    client.delete_object(Bucket=versioned_bucket, Key=key)
    assert verify_objects(expected, s3_client=client).summary().endswith(f"{key}: missing")


def test_what_only_a_head_can_tell_gets_a_head(client: Any, s3_bucket: str) -> None:
    # GIVEN objects with a SHA-256 checksum: rank 0 pinned by its checksum only, rank 1 not
    # pinned but reported with its sha256, rank 2 pinned by its ETag
    import base64
    import hashlib

    data = {r: os.urandom(SIZE) for r in range(3)}
    expected = []
    for rank, body in data.items():
        key = f"job/step-1/rank-{rank}.pt"
        answer = client.put_object(Bucket=s3_bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256")
        uri, sha = f"s3://{s3_bucket}/{key}", hashlib.sha256(body).hexdigest()
        pin = {
            0: StoredObject(
                uri=uri,
                bytes=SIZE,
                checksum_algorithm="SHA256",
                checksum=base64.b64encode(hashlib.sha256(body).digest()).decode(),
            ),
            1: None,
            2: StoredObject(uri=uri, bytes=SIZE, etag=answer["ETag"]),
        }[rank]
        expected.append(Expected(uri, SIZE, sha, pin))
    requests = Requests(client)
    # THEN a listing decides rank 2 only: ranks 0 and 1 need the HEAD's stored checksum
    assert verify_objects(expected, s3_client=client).intact
    assert requests.sent == Counter({"ListObjectsV2": 1, "HeadObject": 2})
    # WHEN ranks 0 and 1 are replaced by other bytes of the same length THEN only those HEADs
    # can tell, and they do
    for rank in (0, 1):
        client.put_object(
            Bucket=s3_bucket,
            Key=f"job/step-1/rank-{rank}.pt",
            Body=os.urandom(SIZE),
            ChecksumAlgorithm="SHA256",
        )
    requests.sent.clear()
    result = verify_objects(expected, s3_client=client, stop_at_first=False)
    assert requests.sent == Counter({"ListObjectsV2": 1, "HeadObject": 2})
    assert [d.uri for d in result.differences] == [e.uri for e in expected[:2]]
    assert "ChecksumSHA256" in result.differences[0].what
    assert "is not the reported sha256" in result.differences[1].what
    # ... and the mode that HEADs everything makes one request per object
    before = requests.total
    verify_objects(expected, s3_client=client, verify_by="head", stop_at_first=False)
    assert requests.total - before == 3


def test_a_client_pool_smaller_than_the_workers_is_used_as_is_with_one_warning(
    moto_endpoint: str, s3_bucket: str, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import boto3

    expected = put_shards(client, s3_bucket, dcp_keys(2))
    default = boto3.session.Session().client("s3", endpoint_url=moto_endpoint)
    caplog.set_level(logging.WARNING, logger="trainer_client.storage.verify")
    for _ in range(2):
        assert verify_objects(expected, s3_client=default, max_workers=64).intact
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "max_pool_connections=10" in lines[0], lines


# -- the pure parts ------------------------------------------------------------------------------


def test_a_prefix_is_listed_whole_in_concurrent_ranges(client: Any, s3_bucket: str) -> None:
    # GIVEN 60 objects under a prefix, cut after every 5th of the first 50 (the keys a caller
    # knows), so keys lie before the first cut, between cuts and after the last; and objects
    # outside the prefix (one where a spread of 16 would put a spread key: this prefix is not)
    keys = sorted(f"store/k-{i:03d}" for i in range(60))
    put_shards(client, s3_bucket, [*keys, "other/k-000", "0/store/k-999"])
    cuts = keys[4:50:5]
    requests = Requests(client)
    # WHEN the prefix is listed cut at those keys, in pages of 3 keys
    items = list_prefix(client, s3_bucket, "store/", split_after=cuts, workers=8, page=3)
    # THEN every object under it once, in key order, as a serial pagination lists them: 11
    # ranges, 10 of 5 keys (2 pages each) and the last of 10 (4 pages)
    assert [item["Key"] for item in items] == keys
    assert all(item["Size"] == SIZE for item in items)
    assert requests.sent == Counter({"ListObjectsV2": 10 * 2 + 4})


def test_key_ranges_are_disjoint_pages_whatever_the_layout() -> None:
    keys = [f"j/s/__{r}_0.distcp" for r in range(2500)]
    ranges = key_ranges(keys)
    assert [r.start_after is None for r in ranges] == [True, False, False]
    ordered = sorted(keys)
    assert [r.last for r in ranges] == [ordered[999], ordered[1999], ordered[-1]]
    assert all(r.prefix == "j/s/__" for r in ranges)
    assert all(sum(r.holds(k) for r in ranges) == 1 for k in keys)
    assert key_ranges(["a/x", "b/y"]) == [KeyRange("", None, "b/y")]
    # The Done-means figures: one listing per 1,000 keys (a DCP checkpoint has its .metadata too)
    assert len(key_ranges([f"__{r}_0.distcp" for r in range(4096)] + [".metadata"])) == 5
    assert len(key_ranges([f"__{r}_0.distcp" for r in range(100_000)] + [".metadata"])) == 101


# Keys that sort next to each other in awkward ways: one a prefix of the next, "/" and "_" and
# digits around a boundary (DCP's "__1_0" sorts after "__19_0"), non-ASCII (S3 lists in UTF-8
# byte order, which code-point order is).
AWKWARD = [
    "c/a", "c/a/", "c/a/b", "c/a0", "c/a_", "c/ab", "c/b", "c/\u00e9", "c/\u00e9/x", "c/z~",
    *(f"c/d/__{r}_0.distcp" for r in (0, 1, 9, 10, 19, 100, 101, 199)), "c/d/.metadata",
]  # fmt: skip


def test_key_ranges_hold_each_key_once_under_their_prefix_whatever_the_layout() -> None:
    import random

    alphabet = ["a", "b", "0", "1", "9", "_", "/", ".", "-", "~", "\u00e9"]
    rng = random.Random(7)
    for per in (1, 2, 3, 7, 1000):
        for _ in range(20):
            keys = {"".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(60)}
            keys.update(AWKWARD)
            ranges = key_ranges(keys, per=per)
            # THEN every key is held by exactly one range, under that range's prefix, and the
            # ranges follow each other (each starts after the last key of the one before)
            for key in keys:
                holders = [r for r in ranges if r.holds(key)]
                assert len(holders) == 1, (key, holders)
                assert key.startswith(holders[0].prefix)
            assert [r.start_after for r in ranges[1:]] == [r.last for r in ranges[:-1]]
            assert all(len([k for k in keys if r.holds(k)]) <= per for r in ranges)


@pytest.mark.parametrize("versioned", [False, True])
def test_concurrent_ranges_list_every_object_once_including_at_their_boundaries(
    client: Any, s3_bucket: str, versioned_bucket: str, versioned: bool
) -> None:
    # GIVEN the awkward keys, in ranges of 3 keys listed in pages of 3 entries, with keys nobody
    # expects next to the ranges' edges (just after a range's last key, just before it) and, in
    # the versioned bucket, a second version of some keys, pinned (so a page can end between two
    # versions of one key); one expected key deleted
    bucket = versioned_bucket if versioned else s3_bucket
    expected = put_shards(client, bucket, AWKWARD)
    ranges = key_ranges(AWKWARD, per=3)
    foreign = [r.last + "!" for r in ranges[:-1]] + [r.last[:-1] for r in ranges[1:]]
    foreign = [k for k in foreign if k not in AWKWARD]
    put_shards(client, bucket, foreign)
    if versioned:
        again = {e.uri: e for e in put_shards(client, bucket, AWKWARD[::4])}
        expected = [again.get(e.uri, e) for e in expected]
    gone = "c/a/b"
    client.delete_object(Bucket=bucket, Key=gone)
    # WHEN each range is listed on its own
    listed = [
        item.key
        for r in key_ranges([e.uri.split("/", 3)[3] for e in expected], per=3)
        for item in _list_range(client, bucket, r, versions=versioned, page=3)
    ]
    # THEN every object present is listed by exactly one range, the strangers in between
    # included (a range's window), the deleted one by none
    present = sorted({e.uri.split("/", 3)[3] for e in expected} - {gone})
    assert sorted(k for k in listed if k in present) == present
    assert len(listed) == len(set(listed))
    # ... and the verification's listing maps each expected object to its own entry
    found = list_expected(expected, client=client, workers=8, page=3)
    assert found[f"s3://{bucket}/{gone}"] is None
    for item in expected:
        key = item.uri.split("/", 3)[3]
        entry = found[item.uri]
        assert entry is None if key == gone else (entry is not None and entry.key == key)
        if entry is not None and versioned:
            assert item.pin is not None and entry.version_id == item.pin.version_id


def _pin(**pins: Any) -> Expected:
    return Expected("s3://b/k", 10, None, StoredObject(uri="s3://b/k", bytes=10, **pins))


@pytest.mark.parametrize(
    ("expected", "listed", "decides"),
    [
        (_pin(etag='"e"'), Listed("k", 10, '"e"'), True),
        (_pin(etag='"e"'), Listed("k", 10, '"f"'), False),  # rewritten: HEAD confirms
        (_pin(etag='"e"'), Listed("k", 9, '"e"'), False),
        (_pin(etag='"e"'), None, False),  # missing: HEAD confirms
        (_pin(etag='"e"', version_id="v1"), Listed("k", 10, '"e"', "v1"), True),
        (_pin(etag='"e"', version_id="v1"), Listed("k", 10, '"e"', "v2"), False),
        (_pin(etag='"e"', version_id="v1"), Listed("k", 10, '"e"'), False),  # no version listed
        (_pin(checksum_algorithm="CRC32", checksum="AAAAAA=="), Listed("k", 10, '"e"'), False),
        (Expected("s3://b/k", 10, "0" * 64), Listed("k", 10, '"e"', None, ("CRC32",)), True),
        (Expected("s3://b/k", 10, "0" * 64), Listed("k", 10, '"e"', None, ("SHA256",)), False),
        (
            Expected("s3://b/k", 10, "0" * 64),
            Listed("k", 10, '"e-2"', None, ("SHA256",), "COMPOSITE"),
            True,
        ),
        (Expected("s3://b/k", 10), Listed("k", 10, '"e"'), True),
        (Expected("s3://b/k/", directory=True), Listed("k/", 0, '"e"'), False),
    ],
)
def test_what_a_listing_decides(expected: Expected, listed: Listed | None, decides: bool) -> None:
    assert listing_decides(expected, listed) is decides
