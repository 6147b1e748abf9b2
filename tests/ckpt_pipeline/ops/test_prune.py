"""``prune`` and ``checkpoints`` end to end: reports through moto's SQS and the real writer, the
CLI against the real database, files on disk.

The scenario of the retention issue's "done": 20 complete checkpoints, a partial newest one, a
superseded attempt; ``prune --keep-last 3 --keep-best 2 --metric loss --apply`` leaves exactly
the 3 newest complete, the 2 best by loss and the in-progress one; a replayed report of a pruned
step changes nothing; ``checkpoints --best loss`` and ``best_complete_checkpoint`` agree.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_contract import CheckpointReport, encode
from ckpt_pipeline.cli import main
from ckpt_pipeline.local.event_source import EventHandler
from ckpt_pipeline.local.lambda_context import context_for
from ckpt_pipeline.local.sqs_events import receive_kwargs, sqs_event
from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer.shared.constants import WRITER_TIMEOUT_S
from trainer_client.restart.best import best_complete_checkpoint
from trainer_client.restart.lookup import latest_complete_checkpoint

JOB = "job-retention"
Report = tuple[int, int, int, int, float]  # step, attempt, world_size, rank, loss


def loss_of(step: int) -> float:
    # Steps 40 and 70 are the best two by loss; the rest get slowly worse.
    return {40: 0.10, 70: 0.20}.get(step, 1.0 + step / 1000)


def scenario_reports() -> list[Report]:
    reports: list[Report] = []
    for step in range(10, 201, 10):
        if step == 50:
            # Attempt 0 on 4 ranks got 3 shards in; attempt 1 on 2 ranks completed: rank 2 of
            # attempt 0 is a superseded shard row.
            reports += [(50, 0, 4, rank, 9.0) for rank in range(3)]
            reports += [(50, 1, 2, rank, loss_of(50)) for rank in range(2)]
        else:
            reports += [(step, 0, 2, rank, loss_of(step) + rank * 0.02) for rank in range(2)]
    reports.append((210, 0, 2, 0, 0.05))  # the newest, still being written
    return reports


def body(root: Path, r: Report) -> str:
    step, attempt, world, rank, loss = r
    path = root / JOB / f"step-{step}" / f"attempt-{attempt}-rank-{rank}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    return encode(
        CheckpointReport.create(
            job_id=JOB,
            run_attempt=attempt,
            step=step,
            epoch=step // 10,
            rank=rank,
            world_size=world,
            uri=path.as_uri(),
            loss=loss,
            created_at=datetime.now(UTC),
        )
    )


def deliver(sqs: Any, queues: PipelineQueues, handler: EventHandler, bodies: list[str]) -> None:
    """Send through moto's FIFO queue, receive, and hand Lambda's event to the real writer."""
    for text in bodies:
        # A fresh dedup id: a replay here is a re-drive, a new message with the same report.
        sqs.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=text,
            MessageGroupId=f"{JOB}:{json.loads(text)['rank']}",
            MessageDeduplicationId=uuid.uuid4().hex,
        )
    received = 0
    while received < len(bodies):
        messages = sqs.receive_message(
            QueueUrl=queues.queue_url,
            **receive_kwargs(max_messages=10, wait_time_s=1, visibility_timeout_s=600),
        ).get("Messages", [])
        assert messages, f"moto returned {received} of {len(bodies)}"
        response = handler(
            sqs_event(messages, queue_arn=queues.queue_arn),
            context_for(timeout_s=WRITER_TIMEOUT_S),
        )
        assert response == {"batchItemFailures": []}
        for m in messages:
            sqs.delete_message(QueueUrl=queues.queue_url, ReceiptHandle=m["ReceiptHandle"])
        received += len(messages)


def snapshot(url: str) -> tuple[list[Any], list[Any]]:
    with psycopg.connect(url) as conn:
        checkpoints = conn.execute(
            "SELECT step, run_attempt, world_size, shards_present, is_complete, updated_at"
            " FROM training_checkpoints WHERE job_id = %s ORDER BY step",
            (JOB,),
        ).fetchall()
        shards = conn.execute(
            "SELECT step, rank, run_attempt, uri, updated_at FROM training_checkpoint_shards"
            " WHERE job_id = %s ORDER BY step, rank",
            (JOB,),
        ).fetchall()
    return checkpoints, shards


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str]:
    capsys.readouterr()  # the writer's log lines so far are not the command's output
    code = main(list(argv), {**os.environ, "DATABASE_URL": url})
    return code, capsys.readouterr().out


@pytest.fixture
def scenario(
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    tmp_path: Path,
    clean_db: str,
) -> dict[str, Any]:
    reports = scenario_reports()
    deliver(sqs, fast_queues, real_writer, [body(tmp_path, r) for r in reports])
    return {"url": clean_db, "root": tmp_path, "reports": reports}


def test_done_scenario(
    scenario: dict[str, Any],
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, root = scenario["url"], scenario["root"]
    policy = ("--keep-last", "3", "--keep-best", "2", "--metric", "loss")
    # GIVEN the job as the writer stored it: 20 complete, step 210 in progress, step 50 with a
    # superseded shard row
    checkpoints, shards = snapshot(url)
    assert len([c for c in checkpoints if c[4]]) == 20
    assert [c[0] for c in checkpoints if not c[4]] == [210]
    assert [(s[0], s[1], s[2]) for s in shards if s[0] == 50] == [
        (50, 0, 1),
        (50, 1, 1),
        (50, 2, 0),
    ]

    # WHEN the dry run, then the same policy with --apply
    code, dry = cli(capsys, scenario["url"], "prune", "--job", JOB, *policy, "--json")
    assert code == 0
    code, applied = cli(
        capsys, scenario["url"], "prune", "--job", JOB, *policy, "--apply", "--json"
    )
    assert code == 0

    # THEN --apply removed exactly what the dry run listed
    planned, done = json.loads(dry), json.loads(applied)
    assert planned["remove"] == done["remove"] and done["kept_changed"] == []
    # ... and left the 3 newest complete, the 2 best by loss and the one in progress
    remaining = [c[0] for c in snapshot(url)[0]]
    assert remaining == [40, 70, 180, 190, 200, 210]
    assert sorted(r["step"] for r in done["remove"]) == [
        s for s in range(10, 201, 10) if s not in (40, 70, 180, 190, 200)
    ]
    step_50 = next(r for r in done["remove"] if r["step"] == 50)
    assert step_50["shard_rows"] == 3  # its superseded row went with it

    # WHEN every report of two pruned steps (one with the superseded attempt) is re-driven
    # through the real writer
    before = snapshot(url)
    replayed = [r for r in scenario["reports"] if r[0] in (10, 50)]
    deliver(sqs, fast_queues, real_writer, [body(root, r) for r in replayed])
    # THEN nothing changed, not even a timestamp
    assert snapshot(url) == before

    # AND `checkpoints --best loss` names the checkpoint best_complete_checkpoint names
    code, listing = cli(
        capsys, scenario["url"], "checkpoints", "--job", JOB, "--best", "loss", "--json"
    )
    assert code == 0
    doc = json.loads(listing)
    best = best_complete_checkpoint(JOB, metric="loss", database_url=url)
    assert best is not None and best.step == 40 and best.value == pytest.approx(0.11)
    assert doc["best"] == {
        "metric": "loss",
        "mode": "min",
        "step": best.step,
        "value": best.value,
        "path": best.path,
    }
    resume = latest_complete_checkpoint(JOB, database_url=url)
    assert resume is not None and doc["resume"] == {"step": 200, "path": resume.path}


def test_best_says_when_there_is_none_and_exits_1(
    scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a job whose reports carry a loss and no other metric
    # WHEN asking for the best by a metric no checkpoint has
    code, text = cli(capsys, scenario["url"], "checkpoints", "--job", JOB, "--best", "acc")
    # THEN it says there is none, and why, in its last line; exit 1 (what was asked for is not
    # there, as `status --job` for a job with no checkpoints)
    assert code == 1
    assert text.splitlines()[-1] == "best acc (min): none: no complete checkpoint has a value of it"
    code, listing = cli(
        capsys, scenario["url"], "checkpoints", "--job", JOB, "--best", "acc", "--json"
    )
    doc = json.loads(listing)
    assert code == 1 and doc["best"] is None
    assert doc["no_best"] == "no complete checkpoint has a value of it"
    # AND when every checkpoint with a value lost its files, it says that
    for path in scenario["root"].rglob("*.pt"):
        path.unlink()
    code, text = cli(
        capsys, scenario["url"], "checkpoints", "--job", JOB, "--best", "loss", "--mode", "max"
    )
    assert code == 1
    assert text.splitlines()[-1] == (
        "best loss (max): none: the 20 complete checkpoints with a value failed the files"
        " check (--no-check-files to skip that check)"
    )
    # AND a best found is exit 0, as before
    code, _ = cli(
        capsys, scenario["url"], "checkpoints", "--job", JOB, "--best", "loss", "--no-check-files"
    )
    assert code == 0


def test_the_text_output_lists_what_goes_and_why_the_rest_stays(
    scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = cli(
        capsys,
        scenario["url"],
        "prune",
        "--job",
        JOB,
        "--keep-last",
        "3",
        "--keep-best",
        "2",
        "--metric",
        "loss",
    )
    assert code == 0
    assert "  remove     step 10 attempt 0: complete, 2 shard rows, value 1.02" in text
    assert "  keep       step 40: best loss" in text
    assert "  keep       step 200: latest complete, resume target, keep-last" in text
    assert "  keep       step 210: in progress" in text
    assert text.rstrip().endswith(
        "dry run: would remove 15 checkpoints (31 shard rows) and 0 superseded shard rows;"
        " --apply removes them"
    )
    # A dry run removes nothing
    assert len(snapshot(scenario["url"])[0]) == 21


def test_superseded_rows_alone(
    scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(
        capsys, scenario["url"], "prune", "--job", JOB, "--superseded", "--apply", "--json"
    )
    assert code == 0
    assert json.loads(out)["superseded"] == [
        {
            "job_id": JOB,
            "step": 50,
            "run_attempt": 1,
            "world_size": 2,
            "is_complete": True,
            "shard_rows": 1,
        }
    ]
    checkpoints, shards = snapshot(scenario["url"])
    assert len(checkpoints) == 21
    assert [(s[0], s[1]) for s in shards if s[0] == 50] == [(50, 0), (50, 1)]


def test_delete_objects_removes_the_files_before_the_rows(
    scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root: Path = scenario["root"] / JOB
    policy = ["prune", "--job", JOB, "--keep-last", "1", "--delete-objects"]
    # The dry run lists the objects --apply deletes: as text under each removal, and as JSON
    code, text = cli(capsys, scenario["url"], *policy)
    planned = [line.split()[1] for line in text.splitlines() if line.startswith("    delete ")]
    code, out = cli(capsys, scenario["url"], *policy, "--json")
    assert code == 0 and [o["uri"] for o in json.loads(out)["objects"]] == planned
    assert len(planned) == 39 and all((root / "step-200").as_uri() not in u for u in planned)
    code, out = cli(capsys, scenario["url"], *policy, "--apply", "--json")
    assert code == 0
    done = json.loads(out)
    # 19 checkpoints' rows named 39 files (step 50: its 2 of attempt 1, 1 of attempt 0)
    assert done["not_deleted"] == [] and done["objects_deleted"] == 39
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.pt"))
    assert left == [
        "step-200/attempt-0-rank-0.pt",
        "step-200/attempt-0-rank-1.pt",
        "step-210/attempt-0-rank-0.pt",
        # Written by attempt 0 of step 50, whose rows attempt 1 replaced: no row names them
        "step-50/attempt-0-rank-0.pt",
        "step-50/attempt-0-rank-1.pt",
    ]


def test_an_object_that_is_not_deleted_keeps_its_rows(
    scenario: dict[str, Any],
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN an old checkpoint stored on s3:// (no pinned version: it must not be deleted)
    s3 = [
        encode(
            CheckpointReport.create(
                job_id=JOB,
                run_attempt=0,
                step=5,
                epoch=0,
                rank=rank,
                world_size=2,
                uri=f"s3://bucket/{JOB}/step-5/rank-{rank}.pt",
                loss=1.0,
                created_at=datetime.now(UTC),
            )
        )
        for rank in range(2)
    ]
    deliver(sqs, fast_queues, real_writer, s3)
    # WHEN it is pruned with --delete-objects
    code, out = cli(
        capsys,
        scenario["url"],
        "prune",
        "--job",
        JOB,
        "--keep-last",
        "1",
        "--delete-objects",
        "--apply",
        "--json",
    )
    # THEN the command fails, says which objects were not deleted and why, and keeps those rows
    assert code == 1
    done = json.loads(out)
    assert [(n["step"], n["uri"]) for n in done["not_deleted"]] == [
        (5, f"s3://bucket/{JOB}/step-5/rank-0.pt"),
        (5, f"s3://bucket/{JOB}/step-5/rank-1.pt"),
    ]
    assert "pinned VersionId or ETag" in done["not_deleted"][0]["reason"]
    assert [c[0] for c in snapshot(scenario["url"])[0]] == [5, 200, 210]


def test_apply_removes_no_more_than_the_plan_when_the_job_moved_on(
    scenario: dict[str, Any], sqs: Any, fast_queues: PipelineQueues, real_writer: EventHandler
) -> None:
    from ckpt_pipeline.ops.prune import apply_plans, plan_prune
    from lambda_writer.prune.policy import RetentionPolicy

    url, root = scenario["url"], scenario["root"]
    policy = RetentionPolicy(keep_last=3)
    plans = plan_prune(url, policy, jobs=[JOB])
    planned = [r.step for r in plans[0].remove]
    # WHEN, after the plan, step 210 completes, and step 10 gets a new attempt (a job rolled back)
    deliver(
        sqs,
        fast_queues,
        real_writer,
        [body(root, (210, 0, 2, 1, 0.05)), body(root, (10, 1, 2, 0, 0.5))],
    )
    outcome = apply_plans(url, plans, policy)[0]
    # THEN the changed step 10 stays, and nothing beyond the plan went (the re-plan would now
    # also drop step 180, which the dry run kept)
    assert outcome.kept_changed == [10]
    assert [r.step for r in outcome.removed] == [s for s in planned if s != 10]
    assert [c[0] for c in snapshot(url)[0]] == [10, 180, 190, 200, 210]


def test_delete_objects_on_s3_deletes_only_the_pinned_version(
    s3: Any,
    versioned_bucket: str,
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    clean_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ckpt_contract.objects import StoredObject

    # GIVEN two checkpoints on moto's versioned S3, each rank's object pinned by its VersionId;
    # then step 1's rank-0 key is written again (a later save to the same path)
    bodies = []
    for step in (1, 2):
        for rank in range(2):
            key = f"{JOB}/step-{step}/rank-{rank}.pt"
            put = s3.put_object(Bucket=versioned_bucket, Key=key, Body=b"v1")
            uri = f"s3://{versioned_bucket}/{key}"
            pin = StoredObject(uri=uri, bytes=2, etag=put["ETag"], version_id=put["VersionId"])
            bodies.append(
                encode(
                    CheckpointReport.create(
                        job_id=JOB,
                        run_attempt=0,
                        step=step,
                        epoch=step,
                        rank=rank,
                        world_size=2,
                        uri=uri,
                        loss=1.0,
                        objects=[pin],
                        created_at=datetime.now(UTC),
                    )
                )
            )
    deliver(sqs, fast_queues, real_writer, bodies)
    newer = s3.put_object(Bucket=versioned_bucket, Key=f"{JOB}/step-1/rank-0.pt", Body=b"v2")
    # WHEN step 1 is pruned with --delete-objects
    code, out = cli(
        capsys,
        clean_db,
        "prune",
        "--job",
        JOB,
        "--keep-last",
        "1",
        "--delete-objects",
        "--no-check-files",
        "--apply",
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["objects_deleted"] == 2
    # THEN exactly the pinned versions are gone; the newer object at the same key stays
    versions = s3.list_object_versions(Bucket=versioned_bucket, Prefix=f"{JOB}/step-1/")
    left = {(v["Key"], v["VersionId"]) for v in versions.get("Versions", [])}
    assert left == {(f"{JOB}/step-1/rank-0.pt", newer["VersionId"])}
    assert s3.get_object(Bucket=versioned_bucket, Key=f"{JOB}/step-1/rank-0.pt")["Body"].read() == (
        b"v2"
    )
    assert [c[0] for c in snapshot(clean_db)[0]] == [2]


def test_delete_objects_keeps_a_spread_object_that_a_staying_row_pins(
    s3: Any,
    s3_bucket: str,
    sqs: Any,
    fast_queues: PipelineQueues,
    real_writer: EventHandler,
    clean_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ckpt_contract.objects import StoredObject
    from trainer_client.storage.uri import spread_key

    # GIVEN two checkpoints uploaded spread (UploadSettings.spread_prefixes: each report names
    # the unspread key, its pin the object at <hex>/key), each step's own file, and a
    # ``last.ckpt`` both steps report: written again with the same bytes (the same ETag)
    def pinned(key: str) -> tuple[str, StoredObject]:
        stored = spread_key(key, 256)
        put = s3.put_object(Bucket=s3_bucket, Key=stored, Body=b"same")
        return f"s3://{s3_bucket}/{key}", StoredObject(
            uri=f"s3://{s3_bucket}/{stored}", bytes=4, etag=put["ETag"]
        )

    bodies = []
    for step in (1, 2):
        for key in (f"{JOB}/step-{step}.ckpt", f"{JOB}/last.ckpt"):
            uri, pin = pinned(key)
            rank = int(key.endswith("last.ckpt"))
            report = CheckpointReport.create(
                job_id=JOB, run_attempt=0, step=step, epoch=step, rank=rank, world_size=2,
                uri=uri, loss=1.0, objects=[pin], created_at=datetime.now(UTC),
            )  # fmt: skip
            bodies.append(encode(report))
    deliver(sqs, fast_queues, real_writer, bodies)
    # WHEN step 1 is pruned with --delete-objects
    code, out = cli(
        capsys, clean_db, "prune", "--job", JOB, "--keep-last", "1", "--delete-objects",
        "--no-check-files", "--apply", "--json",
    )  # fmt: skip
    assert code == 0, out
    # THEN step 1's own object is gone, and the spread last.ckpt that step 2 still pins stays
    assert json.loads(out)["objects_deleted"] == 1
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket).get("Contents", [])}
    assert keys == {spread_key(f"{JOB}/step-2.ckpt", 256), spread_key(f"{JOB}/last.ckpt", 256)}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["prune", "--job", "j", "--keep-last", "0"], "--keep-last: must be at least 1"),
        (["prune", "--all", "--keep-last", "2", "--keep-best", "1"], "--metric: is required"),
        (["prune", "--job", "bad job", "--keep-last", "1"], "--job: must be 1-128 chars"),
        (["prune", "--job", "j", "--keep-last", "1", "--mode", "low"], "--mode: must be min"),
        (["checkpoints", "--job", "j", "--mode", "up"], "--mode: must be min or max"),
        (["checkpoints", "--job", "j", "--best", ""], "--metric: must be loss or a metrics key"),
    ],
)
def test_bad_arguments_name_the_option_and_the_rule(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No database is needed to refuse them: DATABASE_URL points nowhere
    code = main(argv, {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_resume_target_is_kept_when_newer_checkpoints_lost_their_files(
    scenario: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    # GIVEN the newest complete checkpoint's files are gone: a resume goes to step 190
    shutil.rmtree(scenario["root"] / JOB / "step-200")
    resume = latest_complete_checkpoint(JOB, database_url=scenario["url"])
    assert resume is not None and resume.step == 190
    # WHEN pruned down to the newest complete one
    code, out = cli(capsys, scenario["url"], "prune", "--job", JOB, "--keep-last", "1", "--apply")
    # THEN the resume target stays beside it
    assert code == 0, out
    assert [c[0] for c in snapshot(scenario["url"])[0]] == [190, 200, 210]
