"""PyTorch helpers: atomic torch.save, and reports only after an async DCP save succeeded."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import async_save

from ckpt_contract import InvalidMessage
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.trainer_client.helpers import drain, wait_for
from trainer_client import CheckpointReporter
from trainer_client.torch_integration import SaveFailures, atomic_torch_save, report_when_saved


def test_atomic_torch_save_returns_size_and_digest_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "step-5" / "rank-0.pt"
    size, digest = atomic_torch_save({"w": torch.arange(10.0)}, path)
    data = path.read_bytes()
    assert size == len(data) and digest == hashlib.sha256(data).hexdigest()
    assert torch.equal(torch.load(path)["w"], torch.arange(10.0))
    assert [p.name for p in path.parent.iterdir()] == ["rank-0.pt"]


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A real one-rank gloo process group, as DCP's async_save needs."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_async_save_reports_only_when_the_write_succeeded(
    process_group: None, pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    (tmp_path / "not-a-dir").write_text("a file where the checkpoint directory should go")
    failures_before = SaveFailures.count
    with CheckpointReporter(
        pipeline_queues.queue_url, job_id="dcp-job", spool_dir=tmp_path / "spool", spot_poll=False
    ) as rep:
        state = {"w": torch.ones(4)}
        ok = async_save(state, checkpoint_id=str(tmp_path / "ckpt" / "step-10"))
        assert isinstance(ok, Future)
        report_when_saved(rep, ok, step=10, epoch=1, uri=f"file://{tmp_path}/ckpt/step-10")
        bad = async_save(state, checkpoint_id=str(tmp_path / "not-a-dir" / "step-20"))
        assert isinstance(bad, Future)
        report_when_saved(rep, bad, step=20, epoch=2, uri="file:///nowhere")
        with pytest.raises(InvalidMessage):  # bad arguments still fail at the call
            report_when_saved(rep, ok, step=30, epoch=3, uri="file:///x", loss=math.nan)
        ok.result()
        wait_for(lambda: bad.done() and SaveFailures.count == failures_before + 1)
        wait_for(lambda: rep.stats.reported == 1)
        assert rep.flush(10)
    messages = drain(sqs, pipeline_queues.queue_url, expect=1)
    assert [json.loads(m["Body"])["step"] for m in messages] == [10]


def test_close_waits_for_an_async_save_that_completes_after_the_loop(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    import threading

    # GIVEN a save still in flight when the training loop leaves the `with` block
    future: Future[None] = Future()
    rep = CheckpointReporter(
        pipeline_queues.queue_url,
        job_id="late-save",
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        spot_poll=False,
    )
    report_when_saved(rep, future, step=7, epoch=0, uri="file:///ckpt/step-7")
    closer = threading.Thread(target=rep.close, kwargs={"timeout": 20})
    closer.start()
    # WHEN the save completes while close() runs
    future.set_result(None)
    closer.join(30)
    # THEN it was reported and sent, not lost to ReporterClosed
    assert not closer.is_alive()
    assert rep.stats.reported == 1 and rep.stats.sent == 1
    bodies = [json.loads(m["Body"]) for m in drain(sqs, pipeline_queues.queue_url, expect=1)]
    assert [b["step"] for b in bodies] == [7]


def test_dcp_per_rank_report_only_after_a_successful_save_with_its_files(
    process_group: None, pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    from trainer_client.exceptions import IntegrationError
    from trainer_client.integrations.dcp import report_dcp_saved, report_dcp_when_saved

    (tmp_path / "not-a-dir").write_text("a file where the checkpoint directory should go")
    failures_before = SaveFailures.count
    good, bad = tmp_path / "ckpt" / "step-10", tmp_path / "not-a-dir" / "step-20"
    with CheckpointReporter(
        pipeline_queues.queue_url, job_id="dcp-rank", spool_dir=tmp_path / "spool", spot_poll=False
    ) as rep:
        state = {"w": torch.ones(4)}
        # GIVEN an async save that succeeds and one that fails
        ok = report_dcp_when_saved(
            rep, async_save(state, checkpoint_id=str(good)), good, step=10, epoch=1
        )
        failed = report_dcp_when_saved(
            rep, async_save(state, checkpoint_id=str(bad)), bad, step=20, epoch=2
        )
        ok.result(timeout=30)
        failed.result(timeout=30)
        # ... and a synchronous call on a directory whose commit marker is missing
        (tmp_path / "uncommitted").mkdir()
        (tmp_path / "uncommitted" / "__0_0.distcp").write_bytes(b"shard")
        with pytest.raises(IntegrationError, match=r"\.metadata"):
            report_dcp_saved(rep, tmp_path / "uncommitted", step=30, epoch=3)
        wait_for(lambda: rep.stats.reported == 1)
        assert rep.flush(10)
    # THEN only the successful save is reported: rank 0's shard and .metadata, their bytes
    assert SaveFailures.count == failures_before + 1
    (message,) = drain(sqs, pipeline_queues.queue_url, expect=1)
    body = json.loads(message["Body"])
    assert (body["step"], body["uri"]) == (10, good.resolve().as_uri())
    assert body["files"] == [".metadata", "__0_0.distcp"]
    assert body["bytes"] == sum((good / f).stat().st_size for f in body["files"])
