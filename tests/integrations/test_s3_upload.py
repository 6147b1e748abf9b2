"""Uploading a checkpoint to S3 (moto's server) and reporting it once every object is stored."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.trainer_client.helpers import child_env, wait_for
from trainer_client import CheckpointReporter
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.restart.lookup import latest_complete_checkpoint
from trainer_client.storage.exceptions import UploadError
from trainer_client.storage.s3_finish import S3Upload
from trainer_client.storage.s3_upload import (
    MIB,
    UploadSettings,
    _HashingReader,
    upload_checkpoint,
)
from trainer_client.storage.verify import Expected, verify_objects

SMALL_PARTS = UploadSettings(multipart_threshold=5 * MIB, part_size=5 * MIB, max_concurrency=2)


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _checkpoint_dir(root: Path) -> dict[str, bytes]:
    files = {"model.bin": os.urandom(12 * MIB), "state/trainer.json": b'{"step": 5}'}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def test_a_directory_is_uploaded_multipart_and_every_object_pinned(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    files = _checkpoint_dir(tmp_path / "checkpoint-5")
    dest = f"s3://{s3_bucket}/job/checkpoint-5"
    pins = upload_checkpoint(tmp_path / "checkpoint-5", dest, client=s3, settings=SMALL_PARTS)
    assert [p.uri for p in pins] == [f"{dest}/model.bin", f"{dest}/state/trainer.json"]
    for pin, data in zip(pins, files.values(), strict=True):
        assert pin.bytes == len(data) and pin.sha256 == hashlib.sha256(data).hexdigest()
        assert pin.checksum_algorithm == "SHA256" and pin.etag is not None
    # 12 MiB in 5 MiB parts: a multipart object, whose ETag says so; its SHA-256 is composite.
    assert pins[0].etag is not None and pins[0].etag.endswith('-3"')
    assert not pins[0].full_object_checksum and pins[1].full_object_checksum
    checked = verify_objects([Expected(p.uri, p.bytes, p.sha256, p) for p in pins], s3_client=s3)
    assert checked.intact and checked.checked == 2


def test_the_digest_is_of_the_bytes_read_once_whatever_seeks_and_rereads(tmp_path: Path) -> None:
    data = os.urandom(3 * MIB + 17)
    path = tmp_path / "f"
    path.write_bytes(data)
    reader = _HashingReader(path)
    reader.seek(0, io.SEEK_END)  # the transfer's size probe
    reader.seek(0)
    reader.read(MIB)
    reader.seek(0)  # botocore's checksum pass, or a retry, reads the start again
    while reader.read(MIB // 3):
        pass
    reader.close()
    assert reader.hashed == len(data)
    assert reader.digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_store_that_refuses_is_an_upload_error_naming_the_object(s3: Any, tmp_path: Path) -> None:
    path = tmp_path / "f.pt"
    path.write_bytes(b"x")
    with pytest.raises(UploadError, match=r"s3://no-such-bucket-here/f.pt: NoSuchBucket"):
        upload_checkpoint(path, "s3://no-such-bucket-here/f.pt", client=s3)
    with pytest.raises(ValueError, match="part_size: must be at least 5242880"):
        UploadSettings(part_size=MIB)


def _rows(url: str, job: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT step, uri, size_bytes, objects, extra FROM training_checkpoint_shards"
            " WHERE job_id = %s ORDER BY step",
            (job,),
        ).fetchall()


@pytest.mark.slow
def test_the_finisher_reports_the_s3_copy_only_after_every_object_is_stored(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"up-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    _checkpoint_dir(out / "checkpoint-5")
    directory = out / "checkpoint-5"
    with CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job,
        spool_dir=tmp_path / "spool",
        rank=0,
        world_size=1,
        endpoint_url=pipeline.endpoint_url,
        install_signal_handler=False,
        spot_poll=False,
        post_steps=[S3Upload(client=s3, settings=SMALL_PARTS)],
    ) as reporter:
        outcome = reporter.finish(
            sorted(p for p in directory.rglob("*") if p.is_file()),
            base=directory,
            checksums=True,
            post=[PostStepCall("s3_upload", {"prefix": f"s3://{s3_bucket}/{job}"})],
            step=5,
            epoch=0,
            uri=directory.as_uri(),
        ).result(timeout=60)
        assert outcome.status == "reported"
        assert reporter.flush(30)
    settle(pipeline)
    ((step, uri, size, objects, extra),) = _rows(pipeline.database_url, job)
    assert (step, uri) == (5, f"s3://{s3_bucket}/{job}/checkpoint-5")
    assert size == 12 * MIB + len(b'{"step": 5}')
    assert [o["uri"].rsplit(f"{job}/", 1)[1] for o in objects] == [
        "checkpoint-5/model.bin",
        "checkpoint-5/state/trainer.json",
    ]
    assert extra["uploaded_from"] == directory.as_uri()
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.path == uri


@pytest.mark.slow
def test_an_upload_killed_mid_multipart_is_never_reported_and_is_redone_at_the_next_start(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"kill-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "out" / "step-7.pt"
    path.parent.mkdir()
    data = os.urandom(20 * MIB)
    path.write_bytes(data)
    prefix = f"s3://{s3_bucket}/{job}"
    key = f"{job}/out/step-7.pt"
    options = {
        "queue_url": pipeline.queues.queue_url,
        "endpoint": pipeline.endpoint_url,
        "job_id": job,
        "spool": str(tmp_path / "spool"),
        "file": str(path),
        "prefix": prefix,
        "step": 7,
        "bandwidth": 2 * MIB,  # ~10 s for the whole file
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.upload_child", json.dumps(options)],
        env=child_env(**pipeline.client_env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # GIVEN the upload under way: a multipart upload open with at least one part stored
        def one_part_in() -> str | None:
            for upload in s3.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []):
                parts = s3.list_parts(Bucket=s3_bucket, Key=key, UploadId=upload["UploadId"])
                if parts.get("Parts"):
                    return str(upload["UploadId"])
            return None

        killed_upload = wait_for(one_part_in, timeout=60)
        # WHEN the process is killed
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        output = child.communicate()[0]
    assert "reported" not in output, output
    # THEN no object, no report
    settle(pipeline)
    assert _rows(pipeline.database_url, job) == []
    assert s3.list_objects_v2(Bucket=s3_bucket, Prefix=key).get("KeyCount", 0) == 0
    # WHEN a reporter starts again on the same spool THEN the job is finished: uploaded again
    # (the killed attempt's multipart upload aborted), then reported with the object pinned
    with CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job,
        spool_dir=tmp_path / "spool",
        rank=0,
        world_size=1,
        endpoint_url=pipeline.endpoint_url,
        install_signal_handler=False,
        spot_poll=False,
        post_steps=[S3Upload(client=s3, settings=SMALL_PARTS)],
    ) as reporter:
        wait_for(lambda: reporter.stats.reported == 1, timeout=60)
        assert reporter.flush(30)
    settle(pipeline)
    ((step, uri, size, objects, _extra),) = _rows(pipeline.database_url, job)
    assert (step, uri, size) == (7, f"s3://{s3_bucket}/{key}", len(data))
    assert objects[0]["sha256"] == hashlib.sha256(data).hexdigest()
    stored = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    assert stored == data
    open_uploads = s3.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert killed_upload not in [u["UploadId"] for u in open_uploads]
