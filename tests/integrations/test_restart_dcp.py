"""The restart of a DCP job that saves straight to S3 (``s3torchconnector`` on moto), in one
process without torch.distributed: the newest checkpoint's report is durable in the spool and
unsent (SQS unreachable when it was made); the restart's call sends it, waits for the writer,
restores the checkpoint to a fresh local directory verified, and ``dcp.load`` reads it there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.integrations.test_dcp_s3 import _writer
from tests.trainer_client.helpers import free_port
from trainer_client import CheckpointReporter
from trainer_client.integrations.restart import resume
from trainer_client.integrations.resume import latest_complete_checkpoint
from trainer_client.torch_integration import report_when_saved

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("s3torchconnector")


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _reporter(pipeline: LocalPipeline, job: str, spool: Path, **kw: Any) -> CheckpointReporter:
    options: dict[str, Any] = {"endpoint_url": pipeline.endpoint_url, **kw}
    return CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job,
        spool_dir=spool,
        rank=0,
        world_size=1,
        install_signal_handler=False,
        spot_poll=False,
        **options,
    )


@pytest.mark.slow
def test_a_dcp_restart_sends_the_spooled_report_and_loads_the_checkpoint_restored_from_s3(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job, spool = f"dcp-restart-{uuid.uuid4().hex[:8]}", tmp_path / "spool"
    states = {step: {"w": torch.randn(64, 64), "step": torch.tensor(step)} for step in (10, 20)}

    def save(reporter: CheckpointReporter, step: int) -> None:
        uri = f"s3://{s3_bucket}/{job}/step-{step}"
        future = dcp.async_save(states[step], storage_writer=_writer(pipeline.endpoint_url, uri))
        report_when_saved(reporter, future, s3_client=s3, step=step, epoch=0, uri=uri)

    # GIVEN step 10 reported and written, and step 20 saved with its report spooled, unsent
    with _reporter(pipeline, job, spool) as first:
        save(first, 10)
        assert first.flush(30)
    cut_off = _reporter(
        pipeline, job, spool, endpoint_url=f"http://127.0.0.1:{free_port()}", connect_timeout_s=0.2
    )
    save(cut_off, 20)
    assert not cut_off.close(timeout=5) and cut_off.pending == 1
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.step == 10

    # WHEN the job restarts on a fresh node and makes the one call
    node = tmp_path / "node"
    with _reporter(pipeline, job, spool, run_attempt=1) as reporter:
        resumed = resume(
            reporter, database_url=pipeline.database_url, restore_to=node, s3_client=s3
        )

    # THEN it resumes from step 20, restored to the node, and DCP loads it from there
    assert resumed is not None and resumed.step == 20 and resumed.source == "store"
    assert resumed.path == str(node / "step-20")
    assert sorted(p.name for p in Path(resumed.path).iterdir()) == [
        ".ckpt-restore.json",
        ".metadata",
        "__0_0.distcp",
    ]
    loaded = {"w": torch.zeros(64, 64), "step": torch.tensor(0)}
    dcp.load(loaded, checkpoint_id=resumed.path)
    assert torch.equal(loaded["w"], states[20]["w"]) and int(loaded["step"]) == 20
