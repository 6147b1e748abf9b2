"""The verification's pure parts: what each row lets a reader expect, and how a HEAD compares."""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

import pytest

from ckpt_contract import StoredObject
from trainer_client.storage.verify import (
    Expected,
    ShardRecord,
    VerifyError,
    compare_head,
    expectations,
    verify_objects,
)

DATA = b"x" * 100
SHA = hashlib.sha256(DATA).hexdigest()
B64 = base64.b64encode(hashlib.sha256(DATA).digest()).decode()
OTHER_B64 = base64.b64encode(hashlib.sha256(b"y").digest()).decode()


def head(**fields: Any) -> dict[str, Any]:
    return {"ContentLength": 100, "ETag": '"e1"', **fields}


def test_pinned_objects_win_then_listed_files_then_the_uri() -> None:
    pin: dict[str, Any] = {"uri": "s3://b/d/a", "bytes": 3, "etag": '"e"'}
    pinned = ShardRecord(0, "s3://b/d/", 3, None, [pin], {})
    listed = ShardRecord(
        1,
        "file:///c/checkpoint-5",
        9,
        None,
        None,
        {"files": ["x.bin"], "file_sha256": {"x.bin": SHA}},
    )
    plain = ShardRecord(2, "s3://b/r2.pt", 100, SHA, None, {})
    prefix = ShardRecord(3, "s3://b/dir/", None, None, None, {})
    assert expectations([pinned, listed, plain, prefix]) == [
        Expected("s3://b/d/a", 3, None, StoredObject(**pin)),
        Expected("file:///c/checkpoint-5/x.bin", None, SHA),
        Expected("s3://b/r2.pt", 100, SHA),
        Expected("s3://b/dir/", directory=True),
    ]


def test_ranks_reporting_one_file_check_it_once() -> None:
    rows = [ShardRecord(r, "s3://b/step.ckpt", 100, None, None, {}) for r in range(8)]
    assert expectations(rows) == [Expected("s3://b/step.ckpt", 100)]


def test_unreadable_stored_pins_are_an_error_not_a_skip() -> None:
    with pytest.raises(VerifyError, match="rank 0: stored pins unreadable"):
        expectations([ShardRecord(0, "s3://b/k", 1, None, [{"bytes": "x"}], {})])


def test_the_unreadable_pin_is_named_by_its_rank_and_field_among_many() -> None:
    # GIVEN readable pins, an unpinned row, and rank 7's second pin with a size as a word (the
    # pins of a checkpoint are validated in one call: the error still names the row and field)
    good = [
        ShardRecord(r, "s3://b/", 1, None, [{"uri": f"s3://b/{r}", "bytes": 1}], {})
        for r in range(5)
    ]
    plain = ShardRecord(5, "s3://b/r5.pt", 1, None, None, {})
    bad_pins: list[dict[str, Any]] = [
        {"uri": "s3://b/7a", "bytes": 1},
        {"uri": "s3://b/7b", "bytes": "one"},
    ]
    bad = ShardRecord(7, "s3://b/", 2, None, bad_pins, {})
    with pytest.raises(VerifyError, match=r"rank 7: stored pins unreadable: .*\nbytes\n") as caught:
        expectations([*good, plain, bad])
    assert caught.value.name == "objects"
    # ... and the same rows without it are read in order, the unpinned one in its place
    assert [e.uri for e in expectations([*good, plain])] == [
        *(f"s3://b/{r}" for r in range(5)),
        "s3://b/r5.pt",
    ]


def test_list_workers_below_one_is_refused_by_name() -> None:
    with pytest.raises(VerifyError, match="list_workers: must be at least 1"):
        verify_objects([Expected("s3://b/k", 1)], list_workers=0)


@pytest.mark.parametrize("on", [True, False])
def test_the_garbage_collector_is_as_it_was_after_reading_the_pins(on: bool) -> None:
    import gc

    rows = [ShardRecord(0, "s3://b/", 1, None, [{"uri": "s3://b/k", "bytes": 1}], {})]
    (gc.enable if on else gc.disable)()
    try:
        expectations(rows)
        with pytest.raises(VerifyError):
            expectations([ShardRecord(0, "s3://b/k", 1, None, [{"bytes": "x"}], {})])
        assert gc.isenabled() is on
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("answer", "expected", "differs"),
    [
        (head(), Expected("u", 100, SHA), None),  # nothing comparable beyond the size
        (head(ContentLength=96), Expected("u", 100), "size 96 B, reported 100 B"),
        (head(ChecksumSHA256=B64), Expected("u", 100, SHA), None),
        (head(ChecksumSHA256=OTHER_B64), Expected("u", 100, SHA), "is not the reported sha256"),
        # A composite (multipart) SHA-256 describes the parts: not compared with the digest.
        (head(ChecksumSHA256=OTHER_B64, ETag='"e-3"'), Expected("u", 100, SHA), None),
        (head(ChecksumSHA256=OTHER_B64 + "-3"), Expected("u", 100, SHA), None),
        (
            head(ChecksumSHA256=OTHER_B64, ChecksumType="COMPOSITE"),
            Expected("u", 100, SHA),
            None,
        ),
    ],
)
def test_the_reported_sha256_is_compared_only_with_a_full_object_checksum(
    answer: dict[str, Any], expected: Expected, differs: str | None
) -> None:
    result = compare_head(expected, answer)
    assert (result is None) if differs is None else (differs in str(result))


def _pinned(**pin: Any) -> Expected:
    obj = StoredObject(uri="u", bytes=100, **pin)
    return Expected("u", 100, None, obj)


CRC, CRC2 = "AAAAAA==", "AAAAAB=="


def _crc(value: str) -> Expected:
    return _pinned(checksum_algorithm="CRC32", checksum=value)


def _sha(value: str) -> Expected:
    return _pinned(checksum_algorithm="SHA256", checksum=value)


@pytest.mark.parametrize(
    ("answer", "expected", "differs"),
    [
        (head(ChecksumCRC32=CRC), _crc(CRC), None),
        (head(ChecksumCRC32=CRC2), _crc(CRC), f"ChecksumCRC32 {CRC2}, pinned {CRC}"),
        (head(ChecksumCRC32=CRC), _sha(B64), f"no ChecksumSHA256 now, pinned {B64}"),
        (head(ChecksumSHA256=B64 + "-2"), _sha(B64 + "-2"), None),
        (head(ChecksumSHA256=B64), _sha(B64 + "-2"), None),  # moto leaves out the "-N"
        (head(ETag='"e2"'), _pinned(etag='"e1"'), 'ETag "e2", pinned "e1"'),
        (head(VersionId="v2"), _pinned(version_id="v1"), "VersionId v2, pinned v1"),
        (head(), _pinned(version_id="v1"), "VersionId None, pinned v1"),
    ],
)
def test_each_pin_is_compared_with_the_store_s_answer(
    answer: dict[str, Any], expected: Expected, differs: str | None
) -> None:
    assert compare_head(expected, answer) == differs


def test_file_objects_get_the_size_and_the_deep_check(tmp_path: Any) -> None:
    path = tmp_path / "a.pt"
    path.write_bytes(DATA)
    uri = path.as_uri()
    assert verify_objects([Expected(uri, 100, SHA)], deep=True).intact
    path.write_bytes(b"z" * 100)
    assert verify_objects([Expected(uri, 100, SHA)]).intact  # same size: a stat cannot tell
    deep = verify_objects([Expected(uri, 100, SHA)], deep=True)
    assert deep.summary().startswith(f"{uri}: sha256 ")
    path.write_bytes(b"z")
    assert verify_objects([Expected(uri, 100)]).summary() == f"{uri}: size 1 B, reported 100 B"
    path.unlink()
    gone = [Expected(uri, 100), Expected(uri + ".other", 1)]
    result = verify_objects(gone, stop_at_first=False)
    assert result.summary() == f"{uri}: missing (and 1 more)"


def test_an_unknown_scheme_cannot_be_checked() -> None:
    with pytest.raises(VerifyError, match="no check for the 'gs' scheme"):
        verify_objects([Expected("gs://b/k", 1)])


def test_a_403_for_a_missing_key_is_told_apart_from_a_refusal_by_a_listing() -> None:
    # S3 answers HEAD of a missing key with 403 when s3:ListBucket is granted only under the
    # role's prefix (the request carries no s3:prefix). botocore's Stubber plays S3's answers.
    import boto3
    from botocore.stub import Stubber

    client = boto3.session.Session().client(
        "s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    head = {"Bucket": "b", "Key": "p/k", "ChecksumMode": "ENABLED"}
    listing = {"Bucket": "b", "Prefix": "p/k", "MaxKeys": 1}
    with Stubber(client) as stub:
        stub.add_client_error("head_object", "403", http_status_code=403, expected_params=head)
        stub.add_response("list_objects_v2", {"KeyCount": 0}, listing)
        # (verify_by="head": this is the HEAD's path; a listing's is in test_verify_listing)
        only = [Expected("s3://b/p/k", 1)]
        assert verify_objects(only, s3_client=client, verify_by="head").summary() == (
            "s3://b/p/k: missing"
        )
        # A key that is listed but cannot be read: a refusal, not damage.
        stub.add_client_error("head_object", "403", http_status_code=403, expected_params=head)
        stub.add_response("list_objects_v2", {"Contents": [{"Key": "p/k"}]}, listing)
        with pytest.raises(VerifyError, match="s3://b/p/k: 403"):
            verify_objects(only, s3_client=client, verify_by="head")


def test_a_refused_listing_falls_back_to_heads_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A role with s3:GetObject but no s3:ListBucket: the listing is refused, the HEADs answer.
    import boto3
    from botocore.config import Config
    from botocore.stub import Stubber

    client = boto3.session.Session().client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        config=Config(max_pool_connections=64),
    )
    listing = {"Bucket": "b", "Prefix": "p/k", "MaxKeys": 1000}
    head = {"Bucket": "b", "Key": "p/k", "ChecksumMode": "ENABLED"}
    caplog.set_level(logging.WARNING, logger="trainer_client.storage.verify_listing")
    with Stubber(client) as stub:
        stub.add_client_error("list_objects_v2", "AccessDenied", http_status_code=403,
                              expected_params=listing)  # fmt: skip
        stub.add_response("head_object", {"ContentLength": 1, "ETag": '"e"'}, head)
        assert verify_objects([Expected("s3://b/p/k", 1)], s3_client=client).intact
    assert [r.getMessage() for r in caplog.records] == [
        "listing s3://b was refused (no s3:ListBucket?): verifying its objects by HEAD"
    ]
    with pytest.raises(VerifyError, match="verify_by: must be one of listing, head"):
        verify_objects([Expected("s3://b/p/k", 1)], verify_by="list")  # type: ignore[arg-type]
