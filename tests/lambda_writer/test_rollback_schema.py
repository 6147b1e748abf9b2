"""Schema changes are safe to roll back: the previous release's writer runs on today's schema.

A deploy applies the migrations before the new writer exists (docs/deploy.md, deploy order). When
CloudFormation then rolls the stack back, the migration is not undone (it ran in the database, not
in CloudFormation): the previous writer code runs on the new schema. So every migration expands
(adds tables, columns with defaults, functions, triggers the old writer's statements tolerate)
and removes nothing the previous release uses; a contraction waits for a later release.

This test takes the writer as it was at the previous release (``.ci/previous-writer-release``,
a commit; ``git archive`` of its ``lambda_writer`` and ``ckpt_contract``), migrates a fresh
database with every migration of this tree, whatever their number, and runs the old handler, by
the template's handler string in its own interpreter, on a real SQS event: every record written,
none retried, the rows as today's readers read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from infra.constants import WRITER_HANDLER
from lambda_writer.migrate.apply import apply_migrations
from lambda_writer.shared.connection import connect_url
from tests.conftest import empty_database
from tests.lambda_writer.helpers import EventFactory, Outgoing, body, checkpoint_rows, shard_rows

ROOT = Path(__file__).resolve().parents[2]
RELEASE_FILE = ROOT / ".ci" / "previous-writer-release"

# Imports the handler as Lambda's bootstrap does (module from the Handler string) and calls it
# with a context carrying what Lambda's does; prints the batch response.
DRIVER = r"""
import importlib, json, sys, time, uuid

class Context:
    function_name = "ckpt-writer"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:ckpt-writer"
    memory_limit_in_mb = 256
    log_group_name = "/aws/lambda/ckpt-writer"
    log_stream_name = "rollback"
    aws_request_id = str(uuid.uuid4())
    _deadline = time.monotonic() + 30
    def get_remaining_time_in_millis(self):
        return max(0, int((self._deadline - time.monotonic()) * 1000))

module_name, _, attr = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module_name), attr)
print(json.dumps({"from": sys.modules[module_name].__file__}))
print(json.dumps(handler(json.load(sys.stdin), Context())))
"""


def _previous_release(tmp_path: Path) -> Path:
    """The previous release's writer packages, extracted from git into ``tmp_path``."""
    rev = RELEASE_FILE.read_text().split()[0]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "lambda_writer", "ckpt_contract"],
        cwd=ROOT, capture_output=True, check=False,
    )  # fmt: skip
    assert archive.returncode == 0, (
        f"git archive {rev}: {archive.stderr.decode().strip()} (the test needs the repository's"
        " history: a clone, not an export)"
    )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


@pytest.fixture
def current_schema_db() -> Any:
    """A fresh database with every migration of this tree (0014, 0015, … included)."""
    with empty_database("ckpt_rollback") as url:
        with connect_url(url, autocommit=True) as conn:
            applied = apply_migrations(conn)
        migrations = sorted(p.name for p in (ROOT / "lambda_writer" / "migrations").glob("*.sql"))
        assert applied == [name.removesuffix(".sql") for name in migrations] or len(applied) == len(
            migrations
        ), (applied, migrations)
        yield url


def test_the_previous_writer_writes_on_the_current_schema(
    tmp_path: Path, current_schema_db: str, make_event: EventFactory, pipeline_queues: Any
) -> None:
    # GIVEN the previous release's writer and a database migrated by this tree
    old = _previous_release(tmp_path / "previous")
    assert (old / "lambda_writer" / "migrations").is_dir()
    # WHEN it writes a complete two-rank checkpoint and a partial one, from a real SQS event
    event = make_event(
        [
            Outgoing(
                body(
                    job_id="rollback",
                    step=100,
                    rank=0,
                    world_size=2,
                    uri=f"s3://b/rollback/100/{0}.pt",
                ),
                "rollback:0",
            ),
            Outgoing(
                body(
                    job_id="rollback",
                    step=100,
                    rank=1,
                    world_size=2,
                    uri=f"s3://b/rollback/100/{1}.pt",
                ),
                "rollback:1",
            ),
            Outgoing(
                body(
                    job_id="rollback",
                    step=200,
                    rank=0,
                    world_size=2,
                    uri=f"s3://b/rollback/200/{0}.pt",
                ),
                "rollback:0",
            ),
        ]
    )
    env = {
        **os.environ,
        # the old packages first; the site-packages of this interpreter for their dependencies
        "PYTHONPATH": str(old),
        "DATABASE_URL": current_schema_db,
        "DLQ_URL": pipeline_queues.dlq_url,
        "POWERTOOLS_SERVICE_NAME": "ckpt-writer",
        "POWERTOOLS_METRICS_NAMESPACE": "CkptPipeline",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, WRITER_HANDLER],
        input=json.dumps(event), env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    # THEN nothing is retried and today's readers see what it wrote
    assert result.returncode == 0, result.stderr[-3000:]
    # (the writer logs JSON lines to stdout too)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    loaded = next(line["from"] for line in lines if set(line) == {"from"})
    assert loaded.startswith(str(old)), loaded  # the old code ran
    response = lines[-1]
    assert response == {"batchItemFailures": []}, result.stderr[-3000:]
    checkpoints = {(row[0], row[1]): row for row in checkpoint_rows(current_schema_db)}
    assert checkpoints[("rollback", 100)][-1] is True  # is_complete
    assert checkpoints[("rollback", 200)][-1] is False
    assert len(shard_rows(current_schema_db)) == 3
