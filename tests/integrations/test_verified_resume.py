"""Verified resume on S3: reports through moto's SQS and the real writer, objects on moto's S3.

The scenario of the "Done means": a 4-rank job, four checkpoints, each rank's object uploaded
with S3's SHA-256 checksum and reported with its bytes and sha256; then one object of the
newest checkpoint is deleted, one of the next truncated by 4 KiB, one of the third replaced by
other bytes of the same length.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client import CheckpointReporter
from trainer_client.restart.lookup import latest_complete_checkpoint
from trainer_client.storage.s3_pins import head_pin

RANKS = 4
STEPS = (10, 20, 30, 40)
SIZE = 64 * 1024


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _reporters(pipeline: LocalPipeline, spool: Path, job: str) -> dict[int, CheckpointReporter]:
    return {
        rank: CheckpointReporter(
            pipeline.queues.queue_url,
            job_id=job,
            spool_dir=spool,
            rank=rank,
            world_size=RANKS,
            endpoint_url=pipeline.endpoint_url,
            install_signal_handler=False,
            spot_poll=False,
        )
        for rank in range(RANKS)
    }


def save_and_report(
    pipeline: LocalPipeline, s3: Any, bucket: str, spool: Path, job: str, *, pin: bool
) -> dict[tuple[int, int], bytes]:
    """Every rank uploads its shard of every step (SHA-256 checksum) and reports it; with
    ``pin`` the report also pins the object as S3 answered. Returns the bytes by (step, rank)."""
    written: dict[tuple[int, int], bytes] = {}
    reporters = _reporters(pipeline, spool, job)
    try:
        for step in STEPS:
            for rank, reporter in reporters.items():
                data = os.urandom(SIZE)
                key = f"{job}/step-{step}/rank-{rank}.pt"
                s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
                digest = hashlib.sha256(data).hexdigest()
                uri = f"s3://{bucket}/{key}"
                objects = [head_pin(s3, uri, sha256=digest)] if pin else None
                reporter.report(
                    step=step, epoch=step // 10, uri=uri, bytes=SIZE, sha256=digest, objects=objects
                )
                written[(step, rank)] = data
        assert all(r.flush(30) for r in reporters.values())
    finally:
        for r in reporters.values():
            r.close()
    settle(pipeline)
    return written


def damage(s3: Any, bucket: str, job: str, *, replacement_checksum: str | None) -> None:
    """Delete rank 1 of step 40, truncate rank 2 of step 30 by 4 KiB, replace rank 3 of step 20
    with other bytes of the same length."""
    s3.delete_object(Bucket=bucket, Key=f"{job}/step-40/rank-1.pt")
    key = f"{job}/step-30/rank-2.pt"
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=data[:-4096], ChecksumAlgorithm="SHA256")
    extra = {"ChecksumAlgorithm": replacement_checksum} if replacement_checksum else {}
    s3.put_object(Bucket=bucket, Key=f"{job}/step-20/rank-3.pt", Body=os.urandom(SIZE), **extra)


def restore(s3: Any, bucket: str, job: str, written: dict[tuple[int, int], bytes]) -> None:
    for step, rank in ((40, 1), (30, 2), (20, 3)):
        s3.put_object(
            Bucket=bucket,
            Key=f"{job}/step-{step}/rank-{rank}.pt",
            Body=written[(step, rank)],
            ChecksumAlgorithm="SHA256",
        )


def resume_step(pipeline: LocalPipeline, job: str, s3: Any, **options: Any) -> int | None:
    point = latest_complete_checkpoint(
        job, database_url=pipeline.database_url, s3_client=s3, **options
    )
    return None if point is None else point.step


def skipped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not as reported" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize("pin", [False, True], ids=["bytes+sha256", "pinned"])
def test_damaged_checkpoints_are_skipped_for_the_newest_intact_and_named(
    pipeline: LocalPipeline,
    s3: Any,
    s3_bucket: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    pin: bool,
) -> None:
    job = f"verify-{'pin' if pin else 'sha'}"
    written = save_and_report(pipeline, s3, s3_bucket, tmp_path, job, pin=pin)
    assert resume_step(pipeline, job, s3) == 40
    # GIVEN the three newest damaged (the replacement uploaded with S3's SHA-256, as the
    # job's own uploader does) WHEN resuming THEN the oldest, with one line per skipped one
    damage(s3, s3_bucket, job, replacement_checksum="SHA256")
    caplog.set_level(logging.WARNING, logger="trainer_client.restart.lookup")
    assert resume_step(pipeline, job, s3) == 10
    lines = skipped_lines(caplog)
    assert len(lines) == 3, lines
    base = f"s3://{s3_bucket}/{job}"
    assert f"step 40 is complete but not as reported: {base}/step-40/rank-1.pt: missing" in lines[0]
    assert f"{base}/step-30/rank-2.pt: size {SIZE - 4096} B, reported {SIZE} B" in lines[1]
    replaced = f"{base}/step-20/rank-3.pt: ChecksumSHA256 "
    assert replaced in lines[2]
    # Pinned, the stored checksum is compared with the pin; else with the reported sha256.
    assert (", pinned " if pin else "is not the reported sha256") in lines[2]
    # WHEN the objects are restored THEN the newest again (the pinned ETag/checksum are those
    # of the same bytes; an unversioned bucket has no VersionId to differ)
    restore(s3, s3_bucket, job, written)
    assert resume_step(pipeline, job, s3) == 40


@pytest.mark.slow
def test_a_same_length_replacement_without_a_sha256_is_found_by_pins_or_the_deep_check(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # GIVEN step 40's rank 3 replaced by same-length bytes uploaded with boto3's default CRC32
    # (no ChecksumSHA256 to compare with the reported sha256)
    job = "verify-crc"
    save_and_report(pipeline, s3, s3_bucket, tmp_path, job, pin=False)
    s3.put_object(Bucket=s3_bucket, Key=f"{job}/step-40/rank-3.pt", Body=os.urandom(SIZE))
    # THEN a HEAD cannot tell from bytes + sha256 alone (same size, nothing comparable) ...
    assert resume_step(pipeline, job, s3) == 40
    # ... and the deep check, which reads and hashes every object, can
    assert resume_step(pipeline, job, s3, deep=True) == 30

    job = "verify-crc-pinned"
    save_and_report(pipeline, s3, s3_bucket, tmp_path / "p", job, pin=True)
    s3.put_object(Bucket=s3_bucket, Key=f"{job}/step-40/rank-3.pt", Body=os.urandom(SIZE))
    # WHEN the report pinned the object THEN its checksum pin (SHA256, now absent) tells at once
    assert resume_step(pipeline, job, s3) == 30


@pytest.mark.slow
def test_a_later_write_to_the_same_key_in_a_versioned_bucket_does_not_fool_the_check(
    pipeline: LocalPipeline, s3: Any, versioned_bucket: str, tmp_path: Path
) -> None:
    # GIVEN pinned reports in a versioned bucket WHEN the newest's rank 0 is written again with
    # the very same bytes (same size, checksum and ETag: only the version differs) THEN it is
    # not the object that was reported, and the resume says so
    job = "verify-versions"
    written = save_and_report(pipeline, s3, versioned_bucket, tmp_path, job, pin=True)
    assert resume_step(pipeline, job, s3) == 40
    s3.put_object(
        Bucket=versioned_bucket,
        Key=f"{job}/step-40/rank-0.pt",
        Body=written[(40, 0)],
        ChecksumAlgorithm="SHA256",
    )
    assert resume_step(pipeline, job, s3) == 30
    # WHEN the later version is deleted (the pinned one is current again) THEN the newest
    versions = s3.list_object_versions(Bucket=versioned_bucket, Prefix=f"{job}/step-40/rank-0.pt")
    latest = next(v for v in versions["Versions"] if v["IsLatest"])
    s3.delete_object(
        Bucket=versioned_bucket, Key=f"{job}/step-40/rank-0.pt", VersionId=latest["VersionId"]
    )
    assert resume_step(pipeline, job, s3) == 40


@pytest.mark.slow
def test_file_checkpoints_get_the_size_check_and_the_deep_check(
    pipeline: LocalPipeline, tmp_path: Path, s3: Any
) -> None:
    job = "verify-file"
    reporters = _reporters(pipeline, tmp_path / "spool", job)
    files: dict[int, Path] = {}
    try:
        for step in (10, 20):
            for rank, reporter in reporters.items():
                path = tmp_path / f"step-{step}" / f"rank-{rank}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                data = os.urandom(4096)
                path.write_bytes(data)
                files[step * 10 + rank] = path
                digest = hashlib.sha256(data).hexdigest()
                reporter.report(step=step, epoch=0, uri=path.as_uri(), bytes=4096, sha256=digest)
        assert all(r.flush(30) for r in reporters.values())
    finally:
        for r in reporters.values():
            r.close()
    settle(pipeline)
    assert resume_step(pipeline, job, s3) == 20
    # Same length, other bytes: only the deep check reads them.
    files[201].write_bytes(os.urandom(4096))
    assert resume_step(pipeline, job, s3) == 20
    assert resume_step(pipeline, job, s3, deep=True) == 10
    # Truncated: the size check.
    files[202].write_bytes(b"short")
    assert resume_step(pipeline, job, s3) == 10
