"""The pipeline's basics on each SQS emulator (moto and LocalStack): ranks at a barrier -> every
row and every complete checkpoint in the database with nothing in the DLQ, and ``local_pipeline``
starts and stops the emulator it is asked for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_pipeline.demo.fanin import run_pipeline_fanin
from ckpt_pipeline.local.localstack import installed_python, sqs_health
from ckpt_pipeline.local.pipeline import local_pipeline


@pytest.mark.slow
def test_fanin_lands_every_row_once(sqs_endpoint: str, clean_db: str, tmp_path: Path) -> None:
    with local_pipeline(clean_db, endpoint_url=sqs_endpoint) as pipe:
        result = run_pipeline_fanin(
            pipe, job_id="parity", ranks=8, checkpoints=2, spool_dir=tmp_path, timeout_s=120
        )
        assert not result.errors and result.unflushed_ranks == 0
        assert result.shards_found == 16 and result.complete_checkpoints == 2
        assert pipe.dlq_depth() == 0
        assert pipe.source.stats.failed_records == 0


@pytest.mark.skipif(
    installed_python() is None and not os.environ.get("CI"), reason="LocalStack not installed"
)
@pytest.mark.slow  # starts and stops a LocalStack of its own
def test_local_pipeline_runs_its_own_localstack(clean_db: str, tmp_path: Path) -> None:
    with local_pipeline(clean_db, sqs="localstack") as pipe:
        assert sqs_health(pipe.endpoint_url) == "running"
        result = run_pipeline_fanin(
            pipe, job_id="own-ls", ranks=2, checkpoints=1, spool_dir=tmp_path, timeout_s=60
        )
        assert result.shards_found == 2
    assert sqs_health(pipe.endpoint_url) is None
