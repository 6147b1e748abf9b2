"""``reconcile`` and the ranks of a checkpoint: the world size its layout names, and a rank that
wrote its part and never reported (moto's S3 and SQS, the real writer, the real database)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_contract import CheckpointReport
from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.ops.reconcile_backfill import send_reports
from tests.ckpt_pipeline.ops.test_reconcile import _reconcile, _shard_rows
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client.restart.lookup import latest_complete_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _checkpoint(url: str, job: str, step: int) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT world_size, shards_present, is_complete FROM training_checkpoint_progress"
            " WHERE job_id = %s AND step = %s",
            (job, step),
        ).fetchone()


def test_backfill_reports_an_hf_checkpoint_with_the_world_size_its_layout_names(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = "recon-hf"
    store = f"s3://{s3_bucket}/{job}"
    # GIVEN a 2-process Trainer's checkpoint-10 in the store, never reported (process 1 wrote
    # rng_state_1.pth, process 0 everything else), and a checkpoint-20 saved with
    # save_only_model (no rng state: no file names a rank)
    files = {
        "checkpoint-10/model.safetensors": 4096,
        "checkpoint-10/rng_state_0.pth": 16,
        "checkpoint-10/rng_state_1.pth": 16,
        "checkpoint-10/training_args.bin": 8,
        "checkpoint-10/trainer_state.json": 2,
        "checkpoint-20/model.safetensors": 4096,
        "checkpoint-20/trainer_state.json": 2,
    }
    for name, size in files.items():
        s3.put_object(Bucket=s3_bucket, Key=f"{job}/{name}", Body=os.urandom(size))
    # WHEN reconciling (a dry run), and with a --world-size the layout contradicts
    code, out = _reconcile(pipeline, "--job", job, "--store", store, capsys=capsys)
    # THEN step 10 is 2 reports; step 20 is refused in its line, naming why and what to give
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        f"unreported  step 10       {store}/checkpoint-10/ [hf]: 5 objects, 4138 B, no row"
        " (2 reports)"
    )
    assert lines[1] == (
        f"unreported  step 20       {store}/checkpoint-20/ [hf]: 2 objects, 4098 B, no row;"
        " not backfilled: the layout names no world size (no file names a rank (no"
        " rng_state_<rank>.pth, DCP shards or ZeRO partitions: save_only_model?)): give"
        " --world-size (0 reports)"
    )
    _, out = _reconcile(
        pipeline, "--job", job, "--store", store, "--world-size", "3", capsys=capsys
    )
    assert "step 10" in out and "not backfilled: the layout names world size 2, not" in out
    # WHEN backfilling
    code, out = _reconcile(pipeline, "--job", job, "--store", store, "--backfill", capsys=capsys)
    assert "backfilled 2 reports" in out
    settle(pipeline)
    # THEN step 10 is complete as 2 of 2 (not 1 of 1), each process with its own files
    assert _checkpoint(pipeline.database_url, job, 10) == (2, 2, True)
    assert _checkpoint(pipeline.database_url, job, 20) is None
    rows = _shard_rows(pipeline.database_url, job, 10)
    owned = {r[0]: sorted(o["uri"].rsplit("/", 1)[1] for o in r[4]) for r in rows}
    assert owned == {
        0: ["model.safetensors", "rng_state_0.pth", "trainer_state.json", "training_args.bin"],
        1: ["rng_state_1.pth"],
    }
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and point.step == 10


def test_a_rank_that_wrote_and_never_reported_is_found_and_only_it_is_backfilled(
    pipeline: LocalPipeline,
    s3: Any,
    s3_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = "recon-partial"
    store = f"s3://{s3_bucket}/{job}"
    shards: dict[int, tuple[str, bytes]] = {}
    for rank in range(2):
        data = os.urandom(8192)
        key = f"{job}/step-30/__{rank}_0.distcp"
        s3.put_object(Bucket=s3_bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
        shards[rank] = (f"s3://{s3_bucket}/{key}", data)
    s3.put_object(Bucket=s3_bucket, Key=f"{job}/step-30/.metadata", Body=b"meta")
    # GIVEN a 2-rank DCP save of step 30, committed (.metadata), that rank 0 of launch L
    # reported and rank 1 never did (its spool lost with its node)
    uri, data = shards[0]
    launch = uuid.uuid4().hex
    rank_0 = CheckpointReport.create(
        job_id=job,
        run_attempt=0,
        launch_id=launch,
        step=30,
        epoch=0,
        rank=0,
        world_size=2,
        uri=uri,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        created_at=datetime.now(UTC),
    )
    assert send_reports(pipeline.sqs, pipeline.queues.queue_url, [rank_0]) == 1
    settle(pipeline)
    assert _checkpoint(pipeline.database_url, job, 30) == (2, 1, False)
    before = _shard_rows(pipeline.database_url, job, 30)
    # WHEN reconciling THEN the rank with objects and no row is named, with its layout's world
    code, out = _reconcile(pipeline, "--job", job, "--store", store, capsys=capsys)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (
        f"partial     step 30       {store}/step-30/ [dcp]: rank 1 of 2 with no row of attempt 0:"
        " 1 objects, 8192 B (1 reports)"
    )
    assert " 0 unreported, 1 partial, 0 differing," in lines[1]
    # WHEN backfilling THEN that rank only is reported, at the rows' attempt: complete, rank 0's
    # row untouched
    code, out = _reconcile(pipeline, "--job", job, "--store", store, "--backfill", capsys=capsys)
    assert "backfilled 1 reports" in out
    settle(pipeline)
    assert _checkpoint(pipeline.database_url, job, 30) == (2, 2, True)
    after = _shard_rows(pipeline.database_url, job, 30)
    assert after[0] == before[0]
    # (of launch L: the writer checks it against L's claim on the attempt, as any report of L)
    assert after[1][0] == 1
    assert after[1][3] == {"backfilled": True, "layout": "dcp", "launch_id": launch}
    assert [o["uri"] for o in after[1][4]] == [f"{store}/step-30/__1_0.distcp"]
    # AND the next run finds nothing
    code, out = _reconcile(pipeline, "--job", job, "--store", store, capsys=capsys)
    assert code == 0, out
