"""Eight real torch.distributed ranks (gloo, CPU) report five checkpoints each."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract import dedup_id
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.torchrun import free_port
from tests.trainer_client.helpers import drain

WORLD_SIZE = 8
CHECKPOINTS = 5


def _rank_main(rank: int, queue_url: str, spool_dir: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    from trainer_client import CheckpointReporter

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        # rank and world_size come from torch.distributed; job id and attempt from torchrun's env.
        with CheckpointReporter(queue_url, spool_dir=spool_dir, spot_poll=False) as reporter:
            for n in range(CHECKPOINTS):
                dist.barrier()  # the checkpoint barrier where every rank reports at once
                step = (n + 1) * 100
                reporter.report(step=step, epoch=n, uri=f"s3://ckpt/step-{step}/rank-{rank}.pt")
            assert reporter.flush(30), reporter.last_error
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_eight_gloo_ranks_report_forty_distinct_messages(
    pipeline_queues: PipelineQueues,
    sqs: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._dynamo  # noqa: F401 - imported once in the parent, so forked ranks start fast
    from torch.multiprocessing.spawn import start_processes

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "ddp-job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for var in ("RANK", "WORLD_SIZE", "CKPT_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    start_processes(  # type: ignore[no-untyped-call]
        _rank_main,
        args=(pipeline_queues.queue_url, str(tmp_path / "spool"), free_port()),
        nprocs=WORLD_SIZE,
        start_method="fork",
        join=True,
    )
    messages = drain(sqs, pipeline_queues.queue_url, expect=WORLD_SIZE * CHECKPOINTS)
    assert len(messages) == WORLD_SIZE * CHECKPOINTS
    seen: Counter[tuple[int, int]] = Counter()
    # Every rank reports as one launch, agreed through the process group's store at the first
    # report (trainer_client/report/launch.py), under the launcher's count (a first launch).
    launches = {json.loads(m["Body"])["launch_id"] for m in messages}
    assert len(launches) == 1
    (launch,) = launches
    for message in messages:
        body = json.loads(message["Body"])
        rank, step = body["rank"], body["step"]
        attrs = message["Attributes"]
        assert (body["job_id"], body["run_attempt"], body["world_size"]) == ("ddp-job-1", 3, 8)
        assert attrs["MessageGroupId"] == f"ddp-job-1:{rank}"
        assert attrs["MessageDeduplicationId"] == dedup_id("ddp-job-1", 3, step, rank, launch)
        seen[(rank, step)] += 1
    assert set(seen) == {(r, (n + 1) * 100) for r in range(WORLD_SIZE) for n in range(CHECKPOINTS)}
    assert set(seen.values()) == {1}
    assert any((tmp_path / "spool" / "ddp-job-1").iterdir())  # one spool per rank
