"""The demo and its compare mode, asserted on the database, not on printed text."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ckpt_pipeline.demo.compare import run_compare
from ckpt_pipeline.demo.run import run_demo


@pytest.mark.slow
def test_demo_with_a_preempted_rank_records_every_checkpoint_once(
    clean_db: str, tmp_path: Path
) -> None:
    # GIVEN 4 real torchrun ranks, 3 epochs, one rank SIGKILLed in epoch 3 of attempt 0
    result = run_demo(
        clean_db, ranks=4, epochs=3, preemption=True, workdir=tmp_path, console=Console(quiet=True)
    )
    # THEN torchrun restarted the job and finished, and the database has exactly the job
    assert result.preempted_rank == 3
    assert result.torchrun_exit == 0
    v = result.verification
    assert v.row_count == 3
    assert [c.shard_rows for c in v.checkpoints] == [4, 4, 4]
    assert all(c.is_complete and c.shards_of_attempt == 4 for c in v.checkpoints)
    # the preempted epoch was redone by the restarted attempt, which replaced attempt 0's shards
    assert v.checkpoints[-1].run_attempt == 1
    assert v.latest_complete == (12, 2, 1)
    assert result.dlq_depth == 0
    assert 1 <= result.peak_writer_connections <= 2
    assert result.problems == []


@pytest.mark.slow
def test_compare_baseline_loses_rows_at_the_30_connection_cap_and_the_pipeline_does_not(
    tmp_path: Path,
) -> None:
    # GIVEN 32 ranks x pool 5 = 160 wanted connections against max_connections 30
    result = run_compare(ranks=32, checkpoints=2, spool_dir=tmp_path)
    # THEN the seed's design fails with connection errors and loses rows
    assert result.direct.failed > 0
    assert result.direct_rows < result.expected_rows
    assert result.direct_rows == result.direct.succeeded
    assert any("PoolTimeout" in e or "too many" in e for e in result.direct.errors)
    assert result.direct_peak_connections > 2
    # AND the pipeline on the same cap wrote every row with at most 2 connections
    assert result.pipeline_rows == result.expected_rows
    assert sum(result.pipeline.errors.values()) == 0
    assert result.pipeline_dlq == 0
    assert 1 <= result.pipeline_peak_writer_connections <= 2
