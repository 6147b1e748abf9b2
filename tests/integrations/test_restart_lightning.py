"""A fresh-node restart of a 2-rank Lightning DDP job that uploads to S3 (moto): the checkpoint
directory is gone; every rank's ``reporting.resume()`` names the newest complete checkpoint,
restores its file from S3 once on this node, verified, and ``fit(ckpt_path=…)`` resumes there."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.integrations.test_lightning import EVERY_N_STEPS, complete_steps, launch


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


@pytest.mark.slow
def test_fresh_node_lightning_restart_restores_the_checkpoint_file_from_s3(
    pipeline: LocalPipeline, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    job = f"pl-restart-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    last = 2 * EVERY_N_STEPS
    proc = launch(pipeline, job, tmp_path, tmp_path / "run0", max_steps=last, upload_to=prefix)
    assert proc.wait(timeout=300) == 0, (tmp_path / "run0" / "job.log").read_text()[-3000:]
    settle(pipeline)
    assert complete_steps(pipeline.database_url, job) == [EVERY_N_STEPS, last]
    # GIVEN a new instance: the checkpoint directory is gone with its disk
    shutil.rmtree(tmp_path / "ckpt")

    # WHEN the job starts again and every rank makes the restart's call before fit()
    run = tmp_path / "run1"
    proc = launch(
        pipeline, job, tmp_path, run, max_steps=last + EVERY_N_STEPS, upload_to=prefix,
        restart=True,
    )  # fmt: skip
    assert proc.wait(timeout=300) == 0, (run / "job.log").read_text()[-3000:]

    # THEN both ranks resumed from the last checkpoint, restored once on this node
    local = tmp_path / "ckpt" / f"step={last}.ckpt"
    decided = [json.loads((run / f"restart-{r}.json").read_text()) for r in (0, 1)]
    print(f"restart per rank: {decided}")
    assert [d["path"] for d in decided] == [str(local)] * 2
    assert [d["restart"]["step"] for d in decided] == [last, last]
    assert sorted(d["restart"]["source"] for d in decided) == ["manifest", "store"]
    for rank in (0, 1):
        progress = json.loads((run / f"progress-{rank}.json").read_text())
        assert progress["start_step"] == last and progress["step"] == last + EVERY_N_STEPS
