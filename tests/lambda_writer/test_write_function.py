"""The shape of the writer's batch function (migration 0004): one statement, no recount."""

from __future__ import annotations

import re
from pathlib import Path

from lambda_writer import migrations

FUNCTION = (Path(migrations.__file__).parent / "0004_write_batch_delta_count.sql").read_text()
BODY = FUNCTION.split("$fn$")[1]


def test_the_batch_is_one_statement_without_session_state() -> None:
    # Comments aside, the body is BEGIN, one WITH … SELECT … INTO, END.
    code = re.sub(r"--[^\n]*", "", BODY)
    assert code.count(";") == 1  # END has none: the one statement
    assert code.count("INSERT INTO training_checkpoints") == 1
    assert code.count("INSERT INTO training_checkpoint_shards") == 1
    assert "RETURNING s.job_id, s.step, s.run_attempt" in code
    forbidden = (
        r"\b(PREPARE|DEALLOCATE|DISCARD|SAVEPOINT|pg_advisory\w*|TEMP|TEMPORARY|LISTEN|nextval"
        r"|set_config|EXECUTE)\b"
    )
    assert not re.search(forbidden, code, re.IGNORECASE)
    assert not re.search(r"^\s*SET\b", code, re.IGNORECASE | re.MULTILINE)


def test_no_statement_reads_the_checkpoints_shards() -> None:
    # The count moves by the batch's delta: nothing scans the stored shards (0003's recount did,
    # O(world_size) per batch).
    code = re.sub(r"--[^\n]*", "", BODY)
    assert not re.search(r"\b(FROM|JOIN)\s+training_checkpoint_shards\b", code, re.IGNORECASE)
    assert "CREATE OR REPLACE FUNCTION ckpt_write_batch(" in FUNCTION  # same signature as 0003
