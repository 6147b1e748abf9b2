"""Lightning DDP (two CPU ranks) with ``upload_to``: rank 0 uploads its checkpoint file, both ranks
report the S3 object, pinned, once it is stored."""

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
from tests.integrations.test_lightning import EVERY_N_STEPS, launch
from trainer_client.restart.lookup import latest_complete_checkpoint


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_ddp_checkpoints_are_reported_as_their_s3_objects(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"pl-s3-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    proc = launch(
        pipeline, job, tmp_path, tmp_path / "run", max_steps=2 * EVERY_N_STEPS, upload_to=prefix
    )
    assert proc.wait(timeout=300) == 0, (tmp_path / "run" / "job.log").read_text()[-3000:]
    settle(pipeline)
    with psycopg.connect(pipeline.database_url) as conn:
        rows = conn.execute(
            "SELECT step, rank, uri, size_bytes, objects FROM training_checkpoint_shards"
            " WHERE job_id = %s ORDER BY step, rank",
            (job,),
        ).fetchall()
    steps = [EVERY_N_STEPS, 2 * EVERY_N_STEPS]
    assert [(r[0], r[1]) for r in rows] == [(s, rank) for s in steps for rank in (0, 1)]
    for step, _rank, uri, size, objects in rows:
        # ModelCheckpoint(dirpath=tmp/ckpt, filename="{step}"): step=N.ckpt, under the prefix
        # with the directory's name; both ranks name (and pin) the one object rank 0 uploaded.
        assert uri == f"{prefix}/ckpt/step={step}.ckpt"
        ((obj),) = objects
        assert obj["uri"] == uri and obj["bytes"] == size
        local = (tmp_path / "ckpt" / f"step={step}.ckpt").read_bytes()
        stored = s3.get_object(Bucket=s3_bucket, Key=uri.removeprefix(f"s3://{s3_bucket}/"))
        assert stored["Body"].read() == local
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.path == f"{prefix}/ckpt/step={2 * EVERY_N_STEPS}.ckpt"
