"""A job's records belong to the principal that sent its first report (issue 44, migration 0015).

Real event shapes: moto's SQS stamps one SenderId on every message whoever sends it (docs/
DESIGN.md, "Who may write a job"), so each event is received from moto and the second
principal's records carry another id, as Lambda's records from two roles do.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import lambda_writer.migrations
from ckpt_contract import dlq as envelope
from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer import WriterSettings
from lambda_writer.shared.exceptions import SettingsError
from lambda_writer.writer import sql
from lambda_writer.writer.batch import CheckpointWriter
from lambda_writer.writer.planning import BatchPlan, plan_batch
from lambda_writer.writer.records import SqsMessage, ValidReport, classify, sent_by
from tests.lambda_writer.helpers import (
    MOTO_SENDER_ID,
    EventFactory,
    Outgoing,
    body,
    dlq_messages,
    environment,
    invoke,
    sqs_messages,
)

# Job A's nodes: one role, a session per instance (an EC2 instance profile: AROA…:i-…).
OWNER_ROLE = "AROAOWNERROLEEXAMPLE"
OWNER = f"{OWNER_ROLE}:i-0aaa"
OWNER_OTHER_NODE = f"{OWNER_ROLE}:i-0bbb"
# Another team's role, allowed to send to the same queue.
STRANGER_ROLE = "AROASTRANGERROLEEXAM"
STRANGER = f"{STRANGER_ROLE}:i-0ccc"
# The role the stack names for replays (REPLAY_PRINCIPAL_ID).
REPLAYER_ROLE = "AROAREPLAYROLEEXAMPL"


def _sent_by(event: dict[str, Any], *senders: str) -> dict[str, Any]:
    """The event with record i's SenderId set to senders[i] (as SQS stamps it per message)."""
    for record, sender in zip(event["Records"], senders, strict=True):
        assert record["attributes"]["SenderId"] == MOTO_SENDER_ID  # moto's one id, replaced
        record["attributes"]["SenderId"] = sender
    return event


def _newest_complete(url: str, job: str = "job-a") -> tuple[int, int] | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT step, run_attempt FROM latest_complete_checkpoints WHERE job_id = %s", (job,)
        ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def _complete_steps(make_event: EventFactory, url: str, *steps: int) -> None:
    """Job A's owner writes every rank of ``steps`` (world size 2) from two nodes."""
    for step in steps:
        event = make_event(
            [
                Outgoing(body(step=step, rank=rank, world_size=2), group_id=f"job-a:{rank}")
                for rank in (0, 1)
            ]
        )
        assert invoke(_sent_by(event, OWNER, OWNER_OTHER_NODE)) == []
    assert _newest_complete(url) == (steps[-1], 0)


def test_a_foreign_report_changes_nothing_and_is_parked_with_both_ids(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN job A with complete steps 10 and 20, written by its role's nodes
    _complete_steps(make_event, writer_env, 10, 20)
    # WHEN another principal sends one report for step 20 with run_attempt + 1 (before issue 44
    # this superseded attempt 0: step 20 stopped being complete, the restart fell back to 10)
    foreign = body(step=20, rank=0, world_size=2, run_attempt=1)
    assert invoke(_sent_by(make_event([foreign]), STRANGER)) == []
    # THEN job A's newest complete checkpoint is unchanged
    assert _newest_complete(writer_env) == (20, 0)
    # AND the report is in the DLQ, its reason naming both principals, its sender kept
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    attributes = parked["MessageAttributes"]
    assert attributes[envelope.ERROR_CLASS]["StringValue"] == "ForeignSender"
    reason = attributes[envelope.ERROR_MESSAGE]["StringValue"]
    assert reason.startswith("foreign sender: job 'job-a' is owned by")
    assert OWNER_ROLE in reason and STRANGER in reason
    assert attributes[envelope.ORIGINAL_SENDER_ID]["StringValue"] == STRANGER
    assert parked["Body"] == foreign
    # AND the same content from the owner (another of its nodes) is applied: attempt 1 begins
    assert invoke(_sent_by(make_event([foreign]), OWNER_OTHER_NODE)) == []
    with psycopg.connect(writer_env) as conn:
        (attempt,) = conn.execute(
            "SELECT run_attempt FROM training_checkpoints WHERE job_id = 'job-a' AND step = 20"
        ).fetchone() or (None,)
        (owner,) = conn.execute(
            "SELECT owner FROM ckpt_job_owners WHERE job_id = 'job-a'"
        ).fetchone() or (None,)
    assert (attempt, owner) == (1, OWNER_ROLE)
    assert _newest_complete(writer_env) == (10, 0)


def test_a_mixed_batch_writes_the_owners_records_and_parks_the_strangers(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN job A owned by its role, and job B new
    _complete_steps(make_event, writer_env, 10)
    # WHEN one batch holds job A's next step from its owner, a stranger's report of job A, and
    # the stranger's first report of its own job B
    event = make_event(
        [
            Outgoing(body(step=30, rank=0, world_size=2), group_id="job-a:0"),
            Outgoing(body(step=30, rank=1, world_size=2, run_attempt=5), group_id="x:1"),
            Outgoing(body(job_id="job-b", step=1, rank=0, world_size=1), group_id="job-b:0"),
        ]
    )
    assert invoke(_sent_by(event, OWNER, STRANGER, STRANGER)) == []
    # THEN the owner's and job B's are written, the stranger's job-A report is parked
    with psycopg.connect(writer_env) as conn:
        rows = conn.execute(
            "SELECT job_id, step, rank, run_attempt FROM training_checkpoint_shards"
            " WHERE step IN (1, 30) ORDER BY 1, 2, 3"
        ).fetchall()
        owners = conn.execute("SELECT job_id, owner FROM ckpt_job_owners ORDER BY 1").fetchall()
    assert rows == [("job-a", 30, 0, 0), ("job-b", 1, 0, 0)]
    assert owners == [("job-a", OWNER_ROLE), ("job-b", STRANGER_ROLE)]
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    assert json.loads(parked["Body"])["run_attempt"] == 5


def test_a_replay_applies_its_original_sender_only_from_the_replay_principal(
    writer_settings: WriterSettings,
    make_event: EventFactory,
    sqs: Any,
    pipeline_queues: PipelineQueues,
) -> None:
    settings = WriterSettings(
        database_url=writer_settings.database_url,
        dlq_url=writer_settings.dlq_url,
        replay_principal_id=REPLAYER_ROLE,
    )
    url = settings.database_url
    assert url is not None
    with environment(settings):
        _complete_steps(make_event, url, 10)

        def replayed(sender: str, original: str, **fields: Any) -> dict[str, Any]:
            event = make_event([Outgoing(body(world_size=2, **fields), group_id="job-a:0")])
            event["Records"][0]["messageAttributes"][envelope.ORIGINAL_SENDER_ID] = {
                "stringValue": original,
                "dataType": "String",
            }
            return _sent_by(event, sender)

        # WHEN the replay principal re-sends the owner's report THEN it is applied as the owner's
        assert invoke(replayed(f"{REPLAYER_ROLE}:operator", OWNER, step=40)) == []
        # WHEN it re-sends the stranger's report of job A THEN it is refused as the stranger's
        assert invoke(replayed(f"{REPLAYER_ROLE}:operator", STRANGER, step=50)) == []
        # WHEN the stranger claims to be replaying the owner's report THEN it is refused
        assert invoke(replayed(STRANGER, OWNER, step=60)) == []
        with psycopg.connect(url) as conn:
            steps = conn.execute(
                "SELECT step FROM training_checkpoint_shards WHERE job_id = 'job-a' ORDER BY 1"
            ).fetchall()
        assert [s for (s,) in steps] == [10, 10, 40]
        parked = dlq_messages(sqs, pipeline_queues, 2)
        by_step = {json.loads(m["Body"])["step"]: m["MessageAttributes"] for m in parked}
        assert sorted(by_step) == [50, 60]
        for attributes in by_step.values():
            assert attributes[envelope.ERROR_CLASS]["StringValue"] == "ForeignSender"
            # The DLQ copy names the sender it was judged by: a later replay cannot launder it.
            assert attributes[envelope.ORIGINAL_SENDER_ID]["StringValue"] == STRANGER
        assert "not the replay principal" in by_step[60][envelope.ERROR_MESSAGE]["StringValue"]


def test_sent_by_rules() -> None:
    (message,) = sqs_messages([body()], sender_id=OWNER)
    assert sent_by(message, None) == message
    unsigned = message._replace(sender_id=None)
    missing = sent_by(unsigned, None)
    assert not isinstance(missing, SqsMessage) and missing.error_class == "MissingSender"
    # Its own principal replaying (another session of the same role): judged as it is
    own = message._replace(original_sender_id=OWNER_OTHER_NODE)
    assert sent_by(own, None) == message
    replay = message._replace(sender_id=f"{REPLAYER_ROLE}:op", original_sender_id=STRANGER)
    judged = sent_by(replay, REPLAYER_ROLE)
    assert isinstance(judged, SqsMessage) and judged.sender_id == STRANGER
    refused = sent_by(replay, None)
    assert not isinstance(refused, SqsMessage) and refused.error_class == "ForeignSender"
    assert isinstance(classify(message), ValidReport)


def test_the_stricter_mode_refuses_a_job_outside_its_principals_prefixes(
    writer_settings: WriterSettings, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN the stricter mode: the owner's role may write team-a-* jobs, nobody else anything
    settings = WriterSettings.from_env(
        {
            "DATABASE_URL": writer_settings.database_url or "",
            "DLQ_URL": writer_settings.dlq_url or "",
            "JOB_PREFIXES": json.dumps({OWNER_ROLE: ["team-a-"]}),
        }
    )
    assert settings.job_prefixes == {OWNER_ROLE: ("team-a-",)}
    writer = CheckpointWriter(settings)
    try:
        # WHEN the owner's role writes its team's job and another job, and a stranger its own
        result = writer.process(
            sqs_messages([body(job_id="team-a-run1"), body(job_id="job-b")], sender_id=OWNER)
            + sqs_messages([body(job_id="job-c")], sender_id=STRANGER)
        )
    finally:
        writer.connection.discard()
    # THEN only the team's job is written; the others are parked, naming the principal
    assert (result.written, result.poison, result.failed) == (1, 2, [])
    reasons = sorted(
        m["MessageAttributes"][envelope.ERROR_MESSAGE]["StringValue"]
        for m in dlq_messages(sqs, pipeline_queues, 2)
    )
    assert reasons == [
        f"foreign sender: job 'job-b' is outside the prefixes {OWNER_ROLE} may write (team-a-);"
        f" this report was sent by {OWNER}",
        f"foreign sender: job 'job-c' is outside the prefixes {STRANGER_ROLE} may write (none);"
        f" this report was sent by {STRANGER}",
    ]


def test_job_prefixes_are_refused_with_their_rule() -> None:
    for text, rule in (
        ("[]", "non-empty object"),
        ('{"AROAX:i-1": ["a-"]}', "without a session"),
        (json.dumps({OWNER_ROLE: []}), "must list job-id prefixes"),
    ):
        with pytest.raises(SettingsError, match=rule):
            WriterSettings.from_env({"DATABASE_URL": "postgresql://x@h/d", "JOB_PREFIXES": text})


def _lock_wait(url: str, pid: int, timeout_s: float = 30.0) -> str:
    """The lock ``pid`` waits for (pg_stat_activity's wait_event), once it waits: a condition,
    never a sleep for a guessed time."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT wait_event FROM pg_stat_activity"
                " WHERE pid = %s AND wait_event_type = 'Lock'",
                (pid,),
            ).fetchone()
            if row is not None:
                return str(row[0])
            conn.execute("SELECT pg_sleep(0.01)")
    raise AssertionError(f"backend {pid} never waited for a lock")


def _plan(sender: str, **fields: Any) -> BatchPlan:
    (message,) = sqs_messages([body(**fields)], sender_id=sender)
    valid = classify(message)
    assert isinstance(valid, ValidReport)
    return plan_batch([valid])


def test_two_first_reports_of_a_new_job_one_owner_whoever_commits_first(clean_db: str) -> None:
    # GIVEN principal A's first report of job N counted and not yet committed
    first = psycopg.connect(clean_db)
    second = psycopg.connect(clean_db, autocommit=True)
    outcome: list[psycopg.Error | None] = []
    try:
        first.execute(sql.WRITE_BATCH_IN_TRANSACTION, sql.owned_write_params(_plan(OWNER)))

        # WHEN principal B's first report of the same job arrives meanwhile
        def write_second() -> None:
            try:
                second.execute(sql.WRITE_BATCH, sql.claimed_write_params(_plan(STRANGER, rank=1)))
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=write_second)
        thread.start()
        # THEN B waits for A's claim (the unique index), and once A commits B is refused
        assert _lock_wait(clean_db, second.info.backend_pid) == "transactionid"
        first.commit()
        thread.join(timeout=30)
    finally:
        first.close()
        second.close()
    (error,) = outcome
    assert error is not None and error.sqlstate == sql.FOREIGN_SENDER_SQLSTATE
    with psycopg.connect(clean_db) as conn:
        owners = conn.execute("SELECT job_id, owner FROM ckpt_job_owners").fetchall()
        ranks = conn.execute("SELECT rank FROM training_checkpoint_shards").fetchall()
    assert (owners, ranks) == ([("job-a", OWNER_ROLE)], [(0,)])


def test_an_owner_change_waits_for_the_batch_in_flight_and_the_next_batch_for_it(
    clean_db: str,
) -> None:
    from ckpt_pipeline.ops.jobs import transfer

    # GIVEN job A owned by its role, and one of its batches in flight (uncommitted)
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(_plan(OWNER, step=1)))
    batch = psycopg.connect(clean_db)
    operator = psycopg.connect(clean_db, autocommit=True)
    done: list[str] = []
    try:
        batch.execute(sql.WRITE_BATCH_IN_TRANSACTION, sql.owned_write_params(_plan(OWNER, step=2)))
        # WHEN an operator transfers the job to another role
        thread = threading.Thread(
            target=lambda: done.append(
                transfer(operator, "job-a", STRANGER_ROLE, reason="moved").new_owner or ""
            )
        )
        thread.start()
        # THEN the transfer waits for the batch (its table lock), and is done once it commits
        assert _lock_wait(clean_db, operator.info.backend_pid) == "relation"
        assert done == []
        batch.commit()
        thread.join(timeout=30)
    finally:
        batch.close()
        operator.close()
    assert done == [STRANGER_ROLE]
    # AND the old owner's next batch is refused, the new owner's applied
    with psycopg.connect(clean_db, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.IntegrityError) as refused:
            conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(_plan(OWNER, step=3)))
        assert refused.value.sqlstate == sql.FOREIGN_SENDER_SQLSTATE
        conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(_plan(STRANGER, step=3)))
        steps = conn.execute("SELECT step FROM training_checkpoint_shards ORDER BY step").fetchall()
    assert steps == [(1,), (2,), (3,)]


def test_0015s_procedure_is_0007s_body_after_the_claim() -> None:
    # The correctness argument of 0007 (docs/DESIGN.md) carries over only if the repeated body is
    # 0007's statement for statement; what precedes it only reads and claims job owners.
    migrations = Path(lambda_writer.migrations.__file__).parent

    def body_of(name: str, marker: str) -> str:
        fn = (migrations / name).read_text().split(marker)[1].split("$fn$")[1]
        return fn.split("BEGIN", 1)[1]

    counted = body_of(
        "0007_write_batch_lock_before_count.sql",
        "CREATE OR REPLACE PROCEDURE ckpt_write_batch_counted(",
    )
    owned = body_of("0015_job_owners.sql", "CREATE PROCEDURE ckpt_write_batch_owned(")
    claim, repeated = owned.split("    -- 0007's ckpt_write_batch_counted from here.\n")
    assert repeated == counted.lstrip("\n")
    assert "ckpt_claim_jobs(owners)" in claim and "COMMIT" not in claim
