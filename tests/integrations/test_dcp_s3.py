"""DCP straight to S3 (``s3torchconnector``'s storage writer on moto's S3 server), reported with
``report_when_saved`` once the save completed, each rank's objects pinned, with the SHA-256 of
what DCP wrote where ``hash_uploads`` hashed the writer's uploads."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client import CheckpointReporter
from trainer_client.restart.lookup import latest_complete_checkpoint
from trainer_client.storage.dcp_s3 import hash_uploads
from trainer_client.torch_integration import report_when_saved

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
s3tc = pytest.importorskip("s3torchconnector")


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _writer(endpoint: str, uri: str) -> Any:
    """``S3StorageWriter`` pointed at moto: its DCP writer takes no endpoint, so its file system
    is swapped for one whose client has it (path-style, as moto serves)."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    config = S3ClientConfig(force_path_style=True)
    writer: Any = S3StorageWriter(region, uri, s3client_config=config)
    client = S3Client(region, endpoint=endpoint, s3client_config=config)
    writer.fs = S3FileSystem(region, s3_client=client)
    return writer


@pytest.mark.slow
def test_an_async_dcp_save_to_s3_is_reported_after_it_completed_with_its_objects_pinned(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"dcp-s3-{uuid.uuid4().hex[:8]}"
    state = {"w": torch.randn(128, 128), "step": torch.tensor(10)}
    with CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job,
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        endpoint_url=pipeline.endpoint_url,
        install_signal_handler=False,
        spot_poll=False,
    ) as reporter:
        for step in (10, 20):
            uri = f"s3://{s3_bucket}/{job}/step-{step}"
            writer = _writer(pipeline.endpoint_url, uri)
            # step 20's uploads hashed as DCP writes them; step 10's pinned from HEADs alone
            hashed = hash_uploads(writer) if step == 20 else None
            future = dcp.async_save(state, storage_writer=writer)
            report_when_saved(
                reporter, future, s3_client=s3, sha256_of=hashed, step=step, epoch=0, uri=uri
            )
        assert reporter.close(30)
    settle(pipeline)
    with psycopg.connect(pipeline.database_url) as conn:
        rows = conn.execute(
            "SELECT step, uri, size_bytes, objects FROM training_checkpoint_shards"
            " WHERE job_id = %s ORDER BY step",
            (job,),
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        (10, f"s3://{s3_bucket}/{job}/step-10"),
        (20, f"s3://{s3_bucket}/{job}/step-20"),
    ]
    for _step, _uri, size, objects in rows:
        names = [o["uri"].rsplit("/", 1)[1] for o in objects]
        assert names == [".metadata", "__0_0.distcp"]
        assert size == sum(o["bytes"] for o in objects)
        assert all(o["etag"] for o in objects)
    # what DCP wrote, hashed on the way (.metadata under its temporary name, then renamed)
    for obj in rows[1][3]:
        bucket, key = obj["uri"].removeprefix("s3://").split("/", 1)
        stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert obj["sha256"] == hashlib.sha256(stored).hexdigest()
    assert all(o.get("sha256") is None for o in rows[0][3])
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.step == 20
    # The commit marker of the newest gone: it cannot load, the resume takes step 10.
    s3.delete_object(Bucket=s3_bucket, Key=f"{job}/step-20/.metadata")
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.step == 10
