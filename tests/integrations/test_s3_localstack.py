"""Where moto's S3 falls short, on LocalStack's S3: composite checksums on HeadObject, and a
request whose checksum does not match its bytes refused (BadDigest)."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from trainer_client.storage.s3_upload import MIB, UploadSettings, upload_checkpoint
from trainer_client.storage.verify import Expected, verify_objects

pytestmark = pytest.mark.slow


@pytest.fixture
def bucket(localstack_s3: Any) -> str:
    name = f"ls-{uuid.uuid4().hex[:12]}"
    localstack_s3.create_bucket(Bucket=name)
    return name


def test_a_multipart_objects_composite_sha256_is_pinned_and_never_taken_for_the_files(
    localstack_s3: Any, bucket: str, tmp_path: Path
) -> None:
    # GIVEN a 12 MiB file uploaded in 5 MiB parts with SHA-256: S3 (LocalStack) keeps a
    # composite checksum, "<base64>-3" with ChecksumType COMPOSITE, not the file's SHA-256
    data = os.urandom(12 * MIB)
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    settings = UploadSettings(multipart_threshold=5 * MIB, part_size=5 * MIB)
    (pin,) = upload_checkpoint(
        path, f"s3://{bucket}/m.bin", client=localstack_s3, settings=settings
    )
    assert pin.checksum_type == "COMPOSITE" and pin.checksum is not None
    assert pin.checksum.endswith("-3") and pin.etag is not None and pin.etag.endswith('-3"')
    assert pin.sha256 == hashlib.sha256(data).hexdigest()
    assert not pin.full_object_checksum
    # THEN the verification does not compare it with the reported sha256 (no false damage),
    # with or without the pin, and still finds a truncation
    for expected in (
        Expected(pin.uri, pin.bytes, pin.sha256, pin),
        Expected(pin.uri, pin.bytes, pin.sha256),
    ):
        assert verify_objects([expected], s3_client=localstack_s3).intact
    localstack_s3.put_object(Bucket=bucket, Key="m.bin", Body=data[:-4096])
    damaged = verify_objects(
        [Expected(pin.uri, pin.bytes, pin.sha256, pin)], s3_client=localstack_s3
    )
    assert damaged.summary().endswith(f"size {len(data) - 4096} B, reported {len(data)} B")


def test_a_single_part_upload_has_a_full_object_sha256_equal_to_the_files(
    localstack_s3: Any, bucket: str, tmp_path: Path
) -> None:
    path = tmp_path / "small.pt"
    path.write_bytes(b"x" * 1000)
    (pin,) = upload_checkpoint(path, f"s3://{bucket}/small.pt", client=localstack_s3)
    assert pin.checksum_type == "FULL_OBJECT" and pin.full_object_checksum
    assert pin.checksum == base64.b64encode(hashlib.sha256(b"x" * 1000).digest()).decode()


def test_a_body_that_does_not_match_its_checksum_is_refused(
    localstack_s3: Any, bucket: str
) -> None:
    from botocore.exceptions import ClientError

    other = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(ClientError, match="BadDigest"):
        localstack_s3.put_object(Bucket=bucket, Key="k", Body=b"bytes", ChecksumSHA256=other)
