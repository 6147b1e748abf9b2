"""The Hugging Face Trainer on CPU with ``upload_to``: checkpoints reported as their S3 copies.

One real process trains a tiny GPT-2 and saves ``checkpoint-2`` and ``checkpoint-4`` locally;
the callback's finisher uploads each one to moto's S3 and reports ``s3://…/checkpoint-N`` with
every object pinned, only once they are all stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.hf_job import RUN_TIMEOUT_S, HfJob
from trainer_client.restart.lookup import latest_complete_checkpoint


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_trainer_checkpoints_are_reported_as_s3_uris_once_their_objects_are_stored(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = HfJob(pipeline, f"hf-s3-{uuid.uuid4().hex[:8]}", tmp_path)
    job_id, out = job.job_id, job.out
    prefix = f"s3://{s3_bucket}/{job_id}"
    (proc,) = job.launch(
        attempt=0, world=1, max_steps=4, save_steps=2, checksums=True, upload_to=prefix
    )
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, job.tail()
    settle(pipeline)
    with psycopg.connect(pipeline.database_url) as conn:
        rows = conn.execute(
            "SELECT step, uri, size_bytes, objects, extra FROM training_checkpoint_shards"
            " WHERE job_id = %s ORDER BY step",
            (job_id,),
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        (2, f"{prefix}/checkpoint-2"),
        (4, f"{prefix}/checkpoint-4"),
    ]
    for step, _uri, size, objects, extra in rows:
        local = out / f"checkpoint-{step}"
        # Every file the process wrote is an object, byte for byte, with the local file's hash.
        assert sorted(o["uri"].split(f"checkpoint-{step}/", 1)[1] for o in objects) == sorted(
            extra["files"]
        )
        assert sum(o["bytes"] for o in objects) == size
        for obj in objects:
            name = obj["uri"].split(f"checkpoint-{step}/", 1)[1]
            assert obj["sha256"] == extra["file_sha256"][name]
            key = obj["uri"].removeprefix(f"s3://{s3_bucket}/")
            body = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
            assert body == (local / name).read_bytes()
        assert extra["uploaded_from"] == local.resolve().as_uri()
    point = latest_complete_checkpoint(job_id, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.path == f"{prefix}/checkpoint-4"
    # A resume sees the S3 copy: an object of checkpoint-4 gone, it takes checkpoint-2.
    s3.delete_object(Bucket=s3_bucket, Key=f"{job_id}/checkpoint-4/trainer_state.json")
    point = latest_complete_checkpoint(job_id, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.path == f"{prefix}/checkpoint-2"
