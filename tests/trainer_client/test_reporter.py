"""CheckpointReporter in-process against moto's server: validation at the call, send, health."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ckpt_contract import InvalidMessage, MessageTooLarge, dedup_id
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.torchrun import free_port
from tests.trainer_client.helpers import drain
from trainer_client import CheckpointReporter, ReporterClosed, ReporterConfigError, SpoolLocked


def _reporter(queues: PipelineQueues, spool: Path, **kw: Any) -> CheckpointReporter:
    options: dict[str, Any] = {"job_id": "job-a", "rank": 1, "world_size": 4, "spot_poll": False}
    options.update(kw)
    return CheckpointReporter(queues.queue_url, spool_dir=spool, **options)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"loss": math.nan}, "loss"),
        ({"loss": math.inf}, "loss"),
        ({"step": -1}, "step"),
        ({"metrics": {f"m{i}": 1.0 for i in range(300)}}, "metrics"),
        ({"metrics": {"acc": math.nan}}, "metrics.acc"),
        ({"metrics": {"blob": 1.0}, "extra": {"note": "x" * 70_000}}, "<body>"),
        ({"step": 2**63}, "step"),
        ({"epoch": 2**63}, "epoch"),
        ({"bytes": 2**63}, "bytes"),
        ({"uri": "s3://b/a\x00b"}, "uri"),
        ({"uri": "s3://b/\ufffe"}, "uri"),
        ({"uri": "s3://b/\uffff"}, "uri"),
        ({"uri": "s3://b/\ud800"}, "uri"),
        ({"metrics": {"a\x00": 1.0}}, "metrics"),
        ({"extra": {"note": "nul\x00"}}, "note"),
        ({"extra": {"deep": {"x": [math.inf]}}}, "deep.x.0"),
        ({"extra": {"tags": {1, 2}}}, "tags"),
        ({"metrics": [1, 2]}, "metrics"),
        ({"foo": 1}, "foo"),
        ({"job_id": 123}, "job_id"),
        ({"extra": {"job_id": "other"}}, "job_id"),
        ({"sha256": "not-hex"}, "sha256"),
        ({"rank": 3}, "rank"),
    ],
)
def test_bad_arguments_raise_at_the_call_and_spool_nothing(
    pipeline_queues: PipelineQueues, tmp_path: Path, kwargs: dict[str, Any], field: str
) -> None:
    with _reporter(pipeline_queues, tmp_path) as rep:
        size = Path(rep.spool_path).stat().st_size
        fields: dict[str, Any] = {"step": 10, "epoch": 1, "uri": "s3://b/k", **kwargs}
        with pytest.raises(InvalidMessage) as info:
            rep.report(**fields)
        assert any(f == field or f.startswith(field) for f in info.value.fields), info.value
        if field == "<body>":
            assert isinstance(info.value, MessageTooLarge)
        assert Path(rep.spool_path).stat().st_size == size
        assert rep.pending == 0
        assert rep.stats.reported == 0


def test_rank_not_below_world_size_is_rejected_at_construction(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    with pytest.raises(ReporterConfigError, match="rank: must satisfy 0 <= rank < world_size"):
        _reporter(pipeline_queues, tmp_path, rank=4, world_size=4)
    assert not (tmp_path / "job-a").exists()


def test_reports_arrive_with_contract_ids_and_tensor_values(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    with _reporter(pipeline_queues, tmp_path, run_attempt=2) as rep:
        for step in range(12):  # more than one SendMessageBatch
            rep.report(
                step=step,
                epoch=0,
                uri=f"s3://bucket/step-{step}/rank-1.pt",
                loss=torch.tensor(0.25),
                metrics={"acc": np.float32(0.5), "lr": torch.tensor(1e-3, dtype=torch.float64)},
                bytes=123,
            )
        assert rep.flush(10)
        assert rep.pending == 0
        assert rep.last_error is None
        assert (rep.stats.reported, rep.stats.sent, rep.stats.failed) == (12, 12, 0)
    messages = drain(sqs, pipeline_queues.queue_url, expect=12)
    assert len(messages) == 12
    for message in messages:
        body = json.loads(message["Body"])
        assert message["Attributes"]["MessageGroupId"] == "job-a:1"
        assert message["Attributes"]["MessageDeduplicationId"] == dedup_id(
            "job-a", 2, body["step"], 1
        )
        assert body["loss"] == 0.25 and body["metrics"]["acc"] == 0.5
    assert sorted(json.loads(m["Body"])["step"] for m in messages) == list(range(12))


def test_unreachable_sqs_keeps_reports_on_disk_and_reports_health(
    pipeline_queues: PipelineQueues, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainer_client")
    closed = f"http://127.0.0.1:{free_port()}"
    rep = _reporter(
        pipeline_queues,
        tmp_path,
        endpoint_url=closed,
        connect_timeout_s=0.2,
        backlog_warning_interval_s=0.1,
    )
    for step in range(3):
        rep.report(step=step, epoch=0, uri="s3://b/k")  # never raises for an outage
    assert rep.flush(timeout=1.0) is False
    assert rep.pending == 3
    assert rep.last_error is not None
    assert rep.stats.retried >= 3
    warnings = [r.getMessage() for r in caplog.records if "cannot send to SQS" in r.getMessage()]
    assert warnings and all(w.startswith("[job=job-a rank=1] ") for w in warnings)
    assert any("3 report(s) pending on disk" in w for w in warnings)
    assert len(warnings) < 30  # rate-limited, not one line per retry
    assert rep.close(timeout=0.2) is False
    with pytest.raises(ReporterClosed):
        rep.report(step=9, epoch=0, uri="s3://b/k")
    assert "3 report(s) unsent" in caplog.text


def test_second_reporter_for_the_same_job_and_rank_is_refused(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    with (
        _reporter(pipeline_queues, tmp_path),
        pytest.raises(SpoolLocked, match="one reporter per job"),
    ):
        _reporter(pipeline_queues, tmp_path)
    with _reporter(pipeline_queues, tmp_path):  # free again after close()
        pass


def test_rank_and_world_size_from_torch_distributed(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        with CheckpointReporter(
            pipeline_queues.queue_url, job_id="dist-job", spool_dir=tmp_path, spot_poll=False
        ) as rep:
            assert (rep.config.rank, rep.config.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_a_spooled_record_the_contract_refuses_is_set_aside_not_blocking(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN a spool left by another client version with a body this contract rejects
    from trainer_client.report.spool import Spool

    old = Spool(
        tmp_path / "job-a", 1, max_bytes=1 << 20, max_records=10, compact_threshold_bytes=1 << 20
    )
    old.append('{"schema": "ckpt.v0", "job_id": "job-a"}')
    old.close()
    # WHEN a reporter starts on it and reports normally
    with _reporter(pipeline_queues, tmp_path) as rep:
        rep.report(step=5, epoch=0, uri="s3://b/5")
        # THEN the bad record is moved to .rejected and counted; the good one still arrives
        assert rep.flush(10) is False
        assert rep.pending == 0
        assert rep.stats.failed == 1 and rep.stats.sent == 1
        rejected = (tmp_path / "job-a" / "rank-1.rejected").read_bytes()
        assert b"ckpt.v0" in rejected and b"InvalidMessage" in rejected
    assert [
        json.loads(m["Body"])["step"] for m in drain(sqs, pipeline_queues.queue_url, expect=1)
    ] == [5]


def test_region_from_aws_region_alone(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN only AWS_REGION, as EKS and Lambda set it (boto3 alone reads AWS_DEFAULT_REGION)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with _reporter(pipeline_queues, tmp_path) as rep:
        assert rep.config.region == "us-east-1"
        rep.report(step=7, epoch=0, uri="s3://b/7")
        assert rep.flush(10)
    assert [
        json.loads(m["Body"])["step"] for m in drain(sqs, pipeline_queues.queue_url, expect=1)
    ] == [7]


def test_no_region_anywhere_names_where_to_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CONFIG_FILE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ReporterConfigError, match="AWS_DEFAULT_REGION") as info:
        CheckpointReporter(
            "http://127.0.0.1:1/000000000000/q.fifo", job_id="j", rank=0, world_size=1,
            spool_dir=tmp_path, spot_poll=False,
        )  # fmt: skip
    assert info.value.name == "region"


def test_acknowledged_lists_what_sqs_accepted_recovered_reports_included(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN two reports of attempt 0 left unsent in the spool (SQS unreachable)
    closed = f"http://127.0.0.1:{free_port()}"
    rep = _reporter(pipeline_queues, tmp_path, endpoint_url=closed, connect_timeout_s=0.2)
    for step in (3, 6):
        rep.report(step=step, epoch=0, uri="s3://b/k")
    assert rep.acknowledged == frozenset()
    rep.close(timeout=0.2)
    # WHEN the next start (attempt 1) sends them and one report of its own
    with _reporter(pipeline_queues, tmp_path, run_attempt=1) as again:
        again.report(step=9, epoch=0, uri="s3://b/k")
        assert again.flush(10)
        # THEN each is listed with the attempt it was made in (the restart waits for these)
        assert again.acknowledged == {(3, 0), (6, 0), (9, 1)}
