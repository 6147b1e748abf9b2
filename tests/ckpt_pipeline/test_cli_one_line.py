"""Issue 32 §5/§6: every command's bad input is one line naming the setting and the service.

Table-driven: each row runs one command (``main(argv, env)``, the console script's code path)
against the real PostgreSQL server and moto's S3 and SQS, and checks the exit code, that stderr
is exactly one line, and what that line says. A few rows also check what stdout still shows.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.sqs_server import PipelineQueues

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: int
    line: str  # a part of the one stderr line
    env: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None  # a part of stdout, where the command still shows something


@dataclass(frozen=True)
class World:
    database_url: str
    queues: PipelineQueues
    missing_queue: str
    bucket: str
    store: Path


@pytest.fixture
def world(
    clean_db: str, pipeline_queues: PipelineQueues, s3: Any, s3_bucket: str, tmp_path: Path
) -> World:
    """A job `run3` with two complete checkpoints (one object in the bucket under `run3/`)."""
    now = datetime.now(UTC)
    key = "run3/checkpoint-20/model.safetensors"
    s3.put_object(Bucket=s3_bucket, Key=key, Body=b"m")
    with psycopg.connect(clean_db) as conn:
        for step in (10, 20):
            conn.execute(
                "INSERT INTO training_checkpoints (job_id, run_attempt, step, epoch, world_size,"
                " is_complete, first_reported_at) VALUES ('run3', 0, %s, 1, 1, true, %s)",
                (step, now),
            )
        conn.execute(
            "INSERT INTO training_checkpoint_shards (job_id, run_attempt, step, rank, epoch,"
            " world_size, uri, size_bytes, reported_at) VALUES ('run3', 0, 20, 0, 1, 1, %s, 1, %s)",
            (f"s3://{s3_bucket}/{key}", now),
        )
    missing = pipeline_queues.dlq_url.rsplit("/", 1)[0] + f"/gone-{uuid.uuid4().hex[:6]}.fifo"
    return World(clean_db, pipeline_queues, missing, s3_bucket, tmp_path)


def _cases(w: World) -> list[Case]:
    bad_url = {"DATABASE_URL": "postgres://bad url"}
    closed = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:9/x"}
    no_such = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    libpq = "DATABASE_URL: libpq cannot parse it"
    return [
        Case(["status"], 2, libpq, bad_url),
        Case(["migrate"], 2, libpq, bad_url),
        Case(["checkpoints", "--job", "run3"], 2, libpq, bad_url),
        Case(["prune", "--job", "run3", "--keep-last", "1"], 2, libpq, bad_url),
        Case(["reconcile", "--job", "run3", "--store", "s3://b/x"], 2, libpq, bad_url),
        Case(["status"], 1, "PostgreSQL (DATABASE_URL): cannot connect", closed),
        Case(["migrate"], 1, "PostgreSQL (DATABASE_URL): cannot connect", closed),
        Case(["checkpoints", "--job", "run3"], 1, "PostgreSQL (DATABASE_URL): cannot con", closed),
        Case(["status"], 2, "DATABASE_URL: is not set", {"DATABASE_URL": ""}),
        Case(
            ["reconcile", "--job", "run3", "--store", "s3://Bad_Bucket!/x"],
            2,
            "S3 (--store s3://Bad_Bucket!/x/): refused before sending: Invalid bucket name",
        ),
        Case(
            ["reconcile", "--job", "run3", "--store", no_such],
            1,
            f"S3 (--store {no_such}/): NoSuchBucket:",
        ),
        Case(
            ["reconcile", "--job", "run3", "--store", f"s3://{w.bucket}/rn3"],
            2,
            f"--store: no checkpoints under s3://{w.bucket}/rn3/, while the job's 1 rows point"
            f" elsewhere (e.g. s3://{w.bucket}/run3/checkpoint-20/model.safetensors)",
        ),
        Case(
            ["reconcile", "--job", "run3", "--store", "gs://b/x"],
            2,
            "--store: must be s3://bucket[/prefix] or file:///dir",
        ),
        Case(
            ["status", "--dlq-url", w.missing_queue],
            1,
            f"SQS (--dlq-url {w.missing_queue}): AWS.SimpleQueueService.NonExistentQueue",
            stdout="run3",
        ),
        Case(
            ["status", "--queue-url", w.queues.queue_url],
            1,
            "SQS (--queue-url",
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
            stdout="run3",
        ),
        Case(["status", "--job", "bad job!"], 2, "--job: must be 1-128 chars"),
        Case(["checkpoints", "--job", "bad job!"], 2, "--job: must be 1-128 chars"),
        Case(["prune", "--job", "bad job!", "--keep-last", "1"], 2, "--job: must be 1-128 chars"),
        Case(["reconcile", "--job", "bad job!", "--store", "s3://b"], 2, "--job: must be 1-128"),
        Case(["replay-dlq", "--dry-run", "--dlq-url", "not-a-url"], 2, "--dlq-url: must be an SQS"),
        Case(
            ["replay-dlq", "--dry-run", "--dlq-url", w.missing_queue],
            1,
            f"SQS (--dlq-url {w.missing_queue}): AWS.SimpleQueueService.NonExistentQueue",
        ),
        Case(["status", "--bogus"], 2, "ckpt-pipeline: unrecognized arguments: --bogus (see"),
        Case(
            ["prune", "--job", "run3", "--keep-last", "x"],
            2,
            "ckpt-pipeline prune: argument --keep-last: not an integer: 'x' (see",
        ),
    ]


def _run(
    case: Case, w: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, Any]:
    env = {**os.environ, "DATABASE_URL": w.database_url, **case.env}
    if "AWS_ENDPOINT_URL" in case.env:  # boto3 reads its configuration from os.environ
        monkeypatch.setenv("AWS_ENDPOINT_URL", case.env["AWS_ENDPOINT_URL"])
    try:
        code = main(case.argv, env)
    except SystemExit as exc:  # argparse refusals exit from parse_args
        code = int(exc.code or 0)
    monkeypatch.undo()
    return code, capsys.readouterr()


def test_every_bad_input_is_one_line_with_its_exit_code(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = []
    for case in _cases(world):
        code, out = _run(case, world, capsys, monkeypatch)
        lines = out.err.strip().splitlines()
        ok = code == case.code and len(lines) == 1 and case.line in lines[0]
        ok = ok and (case.stdout is None or case.stdout in out.out)
        if not ok:
            failures.append(f"{case.argv} {case.env}: rc {code}\n{out.err}{out.out[-500:]}")
    assert not failures, "\n".join(failures)


def test_status_of_an_unknown_job_says_so_and_exits_1(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "DATABASE_URL": world.database_url}
    assert main(["status", "--job", "nosuchjob"], env) == 1
    out = capsys.readouterr().out
    assert "no checkpoints recorded for job 'nosuchjob'" in out


def test_reconcile_after_prune_lists_the_pruned_and_exits_0(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a directory store holding both of run3's checkpoints, and step 10 pruned
    for step in (10, 20):
        (world.store / f"checkpoint-{step}").mkdir()
        (world.store / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    env = {**os.environ, "DATABASE_URL": world.database_url}
    assert main(["prune", "--job", "run3", "--keep-last", "1", "--apply"], env) == 0
    capsys.readouterr()
    # WHEN reconciling THEN step 10 is pruned, not unreported, and nothing is to do
    argv = ["reconcile", "--job", "run3", "--store", world.store.as_uri(), "--min-age", "0"]
    assert main(argv, env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pruned      step 10 ")
    assert "removed by prune" in out[0]
    assert "0 unreported" in out[-1] and "1 pruned" in out[-1]
    # AND --backfill sends nothing for it
    backfill = [*argv, "--backfill", "--queue-url", world.queues.queue_url]
    assert main(backfill, env) == 0
    assert "backfilled 0 reports" in capsys.readouterr().out
