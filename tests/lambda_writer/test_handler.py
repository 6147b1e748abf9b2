"""The handler on real event shapes from moto, against the real database and a moto DLQ."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_contract.dlq import dlq_dedup_id
from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer.shared.settings import WriterSettings
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    all_rows,
    body,
    checkpoint_rows,
    dlq_messages,
    environment,
    invoke,
    shard_rows,
)


def test_event_has_the_fifo_shape_aws_documents(make_event: EventFactory) -> None:
    # GIVEN a message sent to and received from a FIFO queue
    event = make_event([Outgoing(body(), group_id="job-a:0", dedup_id="d1")])
    # THEN the record carries what Lambda's FIFO event records carry
    (record,) = event["Records"]
    required = {"messageId", "receiptHandle", "body", "attributes", "eventSource"}
    assert required | {"eventSourceARN"} <= set(record)
    assert record["eventSource"] == "aws:sqs"
    attributes = record["attributes"]
    for name in (
        "MessageGroupId",
        "MessageDeduplicationId",
        "SequenceNumber",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
    ):
        assert name in attributes
    assert attributes["MessageGroupId"] == "job-a:0"


def test_valid_batch_is_written(writer_env: str, make_event: EventFactory) -> None:
    event = make_event([Outgoing(body(rank=r), group_id=f"job-a:{r}") for r in range(3)])
    assert invoke(event) == []
    checkpoints, shards = all_rows(writer_env)
    assert checkpoints == [("job-a", 100, 1, 0, 4, 3, False)]
    assert [s[2] for s in shards] == [0, 1, 2]
    first = shards[0]
    assert first[6] == "s3://bucket/job-a/step-100/rank-0.pt"
    assert first[8] == {"acc": 0.9}
    assert first[11] == {}
    with psycopg.connect(writer_env) as conn:
        ids = conn.execute("SELECT sqs_message_id FROM training_checkpoint_shards").fetchall()
    assert sorted(i for (i,) in ids) == sorted(r["messageId"] for r in event["Records"])


def test_unknown_fields_are_kept_as_extra(writer_env: str, make_event: EventFactory) -> None:
    raw = json.loads(body())
    raw["gpu"] = "H100"
    assert invoke(make_event([json.dumps(raw)])) == []
    assert shard_rows(writer_env)[0][11] == {"gpu": "H100"}


def test_replay_three_times_and_shuffled_gives_identical_rows(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN a batch over two checkpoints, with a newer attempt for one shard
    bodies = [body(rank=r, step=s) for s in (100, 200) for r in range(3)]
    bodies.append(body(rank=1, step=100, run_attempt=1, world_size=4))
    event = make_event(bodies)
    assert invoke(event) == []
    once = all_rows(writer_env)
    # WHEN the same batch is delivered again, three times, and shuffled
    for seed in range(3):
        shuffled = dict(event, Records=random.Random(seed).sample(event["Records"], 7))
        assert invoke(event) == []
        assert invoke(shuffled) == []
    # THEN the rows are the same
    assert all_rows(writer_env) == once


def test_older_attempt_after_newer_changes_nothing(
    writer_env: str, make_event: EventFactory
) -> None:
    newer = [body(rank=r, run_attempt=2, epoch=5, uri=f"s3://new/{r}") for r in range(4)]
    assert invoke(make_event(newer)) == []
    before = all_rows(writer_env)
    older = [body(rank=r, run_attempt=1, epoch=4, uri=f"s3://old/{r}") for r in range(4)]
    assert invoke(make_event(older)) == []
    assert all_rows(writer_env) == before
    assert before[0] == [("job-a", 100, 5, 2, 4, 4, True)]


def test_completeness_flips_exactly_at_the_last_shard(
    writer_env: str, make_event: EventFactory
) -> None:
    for rank in range(3):
        assert invoke(make_event([body(rank=rank)])) == []
        assert checkpoint_rows(writer_env) == [("job-a", 100, 1, 0, 4, rank + 1, False)]
    assert invoke(make_event([body(rank=3)])) == []
    assert checkpoint_rows(writer_env) == [("job-a", 100, 1, 0, 4, 4, True)]
    with psycopg.connect(writer_env) as conn:
        row = conn.execute("SELECT completed_at FROM training_checkpoints").fetchone()
        latest = conn.execute("SELECT job_id, step FROM latest_complete_checkpoints").fetchall()
    assert row is not None and row[0] is not None
    assert latest == [("job-a", 100)]


def test_newer_attempt_reopens_a_complete_checkpoint(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN a checkpoint complete under attempt 0
    assert invoke(make_event([body(rank=r) for r in range(2)] + [body(rank=2), body(rank=3)])) == []
    assert checkpoint_rows(writer_env)[0][-1] is True
    # WHEN attempt 1 starts reporting the same step with a smaller world
    assert invoke(make_event([body(rank=0, run_attempt=1, world_size=2)])) == []
    # THEN only attempt 1's shards count, and it is complete when both of them are in
    assert checkpoint_rows(writer_env) == [("job-a", 100, 1, 1, 2, 1, False)]
    assert invoke(make_event([body(rank=1, run_attempt=1, world_size=2)])) == []
    assert checkpoint_rows(writer_env) == [("job-a", 100, 1, 1, 2, 2, True)]


def test_mixed_batch_commits_valid_and_dead_letters_poison(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    nan_body = body(rank=1).replace('"loss":0.5', '"loss":NaN')
    assert "NaN" in nan_body
    wrong_schema = json.loads(body(rank=2))
    wrong_schema["schema"] = "ckpt.v9"
    event = make_event(
        [
            Outgoing(body(rank=0), group_id="job-a:0"),
            Outgoing("{not json", group_id="job-a:1"),
            Outgoing(nan_body, group_id="job-a:1"),
            Outgoing(json.dumps(wrong_schema), group_id="job-a:2"),
            Outgoing(body(rank=3), group_id="job-a:3"),
        ]
    )
    records = event["Records"]
    # WHEN the batch is handled
    assert invoke(event) == []
    # THEN the two valid shards are committed
    assert [s[2] for s in shard_rows(writer_env)] == [0, 3]
    # AND the three poison records are in the DLQ, unchanged, with their reasons
    got = {
        m["MessageAttributes"]["OriginalMessageId"]["StringValue"]: m
        for m in dlq_messages(sqs, pipeline_queues, 3)
    }
    assert set(got) == {records[i]["messageId"] for i in (1, 2, 3)}
    classes = {mid: m["MessageAttributes"]["ErrorClass"]["StringValue"] for mid, m in got.items()}
    assert classes[records[1]["messageId"]] == "UndecodableBody"
    assert classes[records[2]["messageId"]] == "InvalidMessage"
    assert classes[records[3]["messageId"]] == "UnknownSchema"
    nan_msg = got[records[2]["messageId"]]
    assert nan_msg["Body"] == nan_body
    assert "loss" in nan_msg["MessageAttributes"]["ErrorMessage"]["StringValue"]
    attrs = nan_msg["MessageAttributes"]
    assert attrs["SourceQueueArn"]["StringValue"] == pipeline_queues.queue_arn
    assert attrs["ReceiveCount"]["StringValue"] == "1"
    assert attrs["FirstSeenAt"]["StringValue"].endswith("Z")
    assert nan_msg["Attributes"]["MessageGroupId"] == "job-a:1"
    assert nan_msg["Attributes"]["MessageDeduplicationId"] == dlq_dedup_id(records[2]["messageId"])


def test_poison_without_dlq_is_retried_and_blocks_its_group(
    writer_env: str, writer_settings: WriterSettings, make_event: EventFactory
) -> None:
    event = make_event(
        [
            Outgoing(body(rank=0, step=1), group_id="job-a:0"),
            Outgoing("garbage", group_id="job-a:0"),
            Outgoing(body(rank=0, step=2), group_id="job-a:0"),
            Outgoing(body(rank=1, step=2), group_id="job-a:1"),
        ]
    )
    ids = [r["messageId"] for r in event["Records"]]
    # The poison record and the later record of its group are retried; the rest is written.
    with environment(dataclasses.replace(writer_settings, dlq_url=None)):
        assert invoke(event) == [ids[1], ids[2]]
    assert [(s[1], s[2]) for s in shard_rows(writer_env)] == [(1, 0), (2, 1)]


def test_dlq_send_failure_reports_the_record(
    writer_env: str, writer_settings: WriterSettings, make_event: EventFactory
) -> None:
    event = make_event([Outgoing("garbage", group_id="g1"), Outgoing(body(), group_id="g2")])
    # A DLQ that does not exist: the send fails as a whole.
    missing = "http://127.0.0.1:1/000000000000/missing.fifo"
    with environment(dataclasses.replace(writer_settings, dlq_url=missing)):
        assert invoke(event) == [event["Records"][0]["messageId"]]
    assert len(shard_rows(writer_env)) == 1


def test_permanent_db_error_isolates_the_record(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN a constraint the contract cannot know of (an operator's CHECK on the table; the
    # contract itself now refuses every value the columns cannot hold) and a batch where one
    # report breaks it
    with psycopg.connect(writer_env, autocommit=True) as admin:
        admin.execute(
            "ALTER TABLE training_checkpoint_shards ADD CONSTRAINT test_no_poison_uri"
            " CHECK (uri <> 'file:///poison') NOT VALID"
        )
    try:
        event = make_event(
            [
                Outgoing(body(rank=0), group_id="job-a:0"),
                Outgoing(body(rank=1, uri="file:///poison"), group_id="job-a:1"),
                Outgoing(body(rank=2), group_id="job-a:2"),
            ]
        )
        # WHEN handled: the batch transaction fails, records are retried one by one
        assert invoke(event) == []
    finally:
        with psycopg.connect(writer_env, autocommit=True) as admin:
            admin.execute(
                "ALTER TABLE training_checkpoint_shards DROP CONSTRAINT test_no_poison_uri"
            )
    # THEN the good ones are committed and the bad one is in the DLQ with the DB's reason
    assert [s[2] for s in shard_rows(writer_env)] == [0, 2]
    (dead,) = dlq_messages(sqs, pipeline_queues, 1)
    attrs = dead["MessageAttributes"]
    assert attrs["OriginalMessageId"]["StringValue"] == event["Records"][1]["messageId"]
    assert attrs["ErrorClass"]["StringValue"] == "CheckViolation"
    assert checkpoint_rows(writer_env) == [("job-a", 100, 1, 0, 4, 2, False)]


def test_metrics_are_emitted_as_emf(
    writer_settings: WriterSettings,
    make_event: EventFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    event = make_event([body(rank=0), body(rank=1), "garbage"])
    with environment(writer_settings, emit_metrics=True):  # as in Lambda
        assert invoke(event) == []
        assert invoke(event) == []  # replay: two no-ops
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert len(emf) == 2
    names = {m["Name"] for m in emf[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {
        "RecordsWritten",
        "PoisonRecords",
        "TransientFailures",
        "BatchLatencyMs",
        "RowsChanged",
        "NoopReplays",
    }
    assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "CkptPipeline"
    assert emf[0]["service"] == "ckpt-writer"
    # Powertools serialises each metric's values as a list.
    first, again = emf
    assert (first["RowsChanged"], first["NoopReplays"], first["PoisonRecords"]) == ([2], [0], [1])
    assert (again["RowsChanged"], again["NoopReplays"], again["RecordsWritten"]) == ([0], [2], [2])


def test_local_environments_print_no_metrics(
    writer_env: str, make_event: EventFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    assert invoke(make_event([body()])) == []
    assert '"_aws"' not in capsys.readouterr().out


def test_logs_are_json_with_record_fields_request_id_and_cold_start(
    writer_settings: WriterSettings, make_event: EventFactory
) -> None:
    from ckpt_pipeline.local.lambda_context import context_for
    from lambda_writer.writer import handler as handler_module

    # Powertools' handler holds the stdout of import time; add one with its JSON formatter.
    stream = io.StringIO()
    sink = logging.StreamHandler(stream)
    sink.setFormatter(handler_module.logger.registered_formatter)
    std_logger = logging.getLogger("ckpt-writer")
    std_logger.addHandler(sink)
    contexts = [context_for(timeout_s=30), context_for(timeout_s=30)]
    try:
        event = make_event([body(rank=2)])
        # The level as in Lambda, whatever an earlier local environment of this process set.
        with environment(writer_settings, log_level="INFO") as handler:
            for context in contexts:
                assert handler(event, context) == {"batchItemFailures": []}
    finally:
        std_logger.removeHandler(sink)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    written = [x for x in lines if x.get("message") == "record written"]
    assert written
    assert written[0]["messageId"] == event["Records"][0]["messageId"]
    assert (written[0]["job_id"], written[0]["step"], written[0]["rank"]) == ("job-a", 100, 2)
    assert written[0]["service"] == "ckpt-writer"
    # inject_lambda_context: every line of an invocation carries its request id and cold start
    done = [x for x in lines if x.get("message") == "batch done"]
    assert [x["function_request_id"] for x in done] == [c.aws_request_id for c in contexts]
    assert written[0]["function_request_id"] == contexts[0].aws_request_id
    assert written[0]["function_name"] == contexts[0].function_name
    assert done[1]["cold_start"] is False  # the second invocation of this environment is warm


def test_metrics_are_flushed_when_the_handler_raises(
    writer_settings: WriterSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_pipeline.local.lambda_context import context_for
    from lambda_writer.writer.exceptions import MalformedEvent

    with (
        environment(writer_settings, emit_metrics=True) as handler,
        pytest.raises(MalformedEvent),
    ):
        handler({"detail-type": "Scheduled Event"}, context_for(timeout_s=30))
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert len(emf) == 1 and "BatchLatencyMs" in emf[0]


def test_powertools_switch_off_never_accumulates_metrics_into_output(
    writer_settings: WriterSettings,
) -> None:
    # GIVEN the Lambda entry point with Powertools' own switch off (an operator's setting in the
    # function's environment): Powertools then keeps the set, and prints a metric once it holds
    # 100 values
    code = (
        "import json, lambda_writer.writer.handler as h;"
        "from ckpt_pipeline.local.lambda_context import context_for;"
        "from lambda_writer.writer.exceptions import MalformedEvent\n"
        "for _ in range(101):\n"
        "    try: h.handler({'Records': 'x'}, context_for(timeout_s=30))\n"
        "    except MalformedEvent: pass\n"
        "print(max(len(m['Value']) for m in h.metrics.metric_set.values()))"
    )
    env = {
        **os.environ,
        "DATABASE_URL": str(writer_settings.database_url),
        "POWERTOOLS_METRICS_DISABLED": "true",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    # THEN nothing reaches stdout and the set holds one invocation's values at most
    assert '"_aws"' not in out
    assert out.splitlines()[-1] == "1"


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task"}, True),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, False),
    ],
)
def test_tracing_is_on_exactly_where_powertools_would_trace(
    env: dict[str, str], enabled: bool
) -> None:
    from lambda_writer.writer.handler import tracing_enabled

    assert tracing_enabled(env) is enabled


def test_in_lambda_the_tracer_sends_the_handler_subsegment_to_the_daemon(
    writer_settings: WriterSettings, make_event: EventFactory, tmp_path: Path
) -> None:
    # GIVEN a fresh interpreter with Lambda's tracing environment and a real UDP "daemon"
    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(("127.0.0.1", 0))
    daemon.settimeout(20)
    trace_root = "1-5759e988-bd862e3fe1be46a994272793"
    env = {
        **os.environ,
        "LAMBDA_TASK_ROOT": str(Path.cwd()),
        "DATABASE_URL": str(writer_settings.database_url),
        "DLQ_URL": str(writer_settings.dlq_url),
        "_X_AMZN_TRACE_ID": f"Root={trace_root};Parent=53995c3f42cd8ad8;Sampled=1",
        "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{daemon.getsockname()[1]}",
        "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
        "POWERTOOLS_METRICS_DISABLED": "true",
    }
    event_file = tmp_path / "event.json"
    # (one poison record: its DLQ send is an AWS call, traced as an SQS subsegment)
    event_file.write_text(json.dumps(make_event([body(rank=3), "garbage"])))
    code = (
        "import json, sys; from lambda_writer.writer.handler import handler;"
        "from ckpt_pipeline.local.lambda_context import context_for;"
        "print(json.dumps(handler(json.load(open(sys.argv[1])), context_for(timeout_s=30))))"
    )
    try:
        # WHEN the handler runs one real batch
        out = subprocess.run(
            [sys.executable, "-c", code, str(event_file)],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        assert json.loads(out.stdout.splitlines()[-1]) == {"batchItemFailures": []}
        # THEN the daemon got the handler's subsegment and, under it, the DLQ call's
        sent: dict[str, dict[str, Any]] = {}
        while not {"## handler", "sqs"} <= set(sent):
            header, _, segment = daemon.recv(65536).decode().partition("\n")
            assert json.loads(header) == {"format": "json", "version": 1}
            document = json.loads(segment)
            sent[document["name"]] = document
    finally:
        daemon.close()
    handler_segment = sent["## handler"]
    assert handler_segment["trace_id"] == trace_root
    assert handler_segment["annotations"]["ColdStart"] is True
    assert sent["sqs"]["aws"]["operation"] == "SendMessageBatch"
    assert sent["sqs"]["parent_id"] == handler_segment["id"]
    assert shard_rows(str(writer_settings.database_url))
