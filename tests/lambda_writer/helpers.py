"""Helpers of the writer tests: report builders, handler invocation, row snapshots."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from ckpt_contract import CheckpointReport
from ckpt_pipeline.local.lambda_context import context_for
from ckpt_pipeline.local.sqs_events import receive_kwargs
from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer import WriterHandler, WriterSettings, make_handler
from lambda_writer.shared.constants import WRITER_TIMEOUT_S
from lambda_writer.writer.records import SqsMessage
from tests import reports

Row = tuple[Any, ...]
CHECKPOINT_COLUMNS = "job_id, step, epoch, run_attempt, world_size, shards_present, is_complete"
SHARD_COLUMNS = (
    "job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics, size_bytes, sha256,"
    " extra, reported_at"
)


def report(**overrides: Any) -> CheckpointReport:
    """A valid report (the tests' factory, :func:`tests.reports.report`); fields overridable."""
    return reports.report(**overrides)


def body(**overrides: Any) -> str:
    """The encoded body of :func:`report`."""
    return reports.body(**overrides)


@dataclass(frozen=True)
class Outgoing:
    """One message to send: its body and group (dedup id random unless given)."""

    body: str
    group_id: str = "job-a:0"
    dedup_id: str | None = None


EventFactory = Callable[[Sequence["Outgoing | str"]], dict[str, Any]]


# The execution environments the tests have open, innermost last: ``invoke`` calls the last.
_environments: list[WriterHandler] = []


@contextmanager
def environment(
    settings: WriterSettings, *, emit_metrics: bool = False, log_level: str = "INFO"
) -> Iterator[WriterHandler]:
    """One execution environment of the real writer for ``settings`` (its connection closed at
    the end); :func:`invoke` calls it while the block runs. Its logger at INFO, the level a
    deployed writer logs at: the level is the process's, and a local pipeline earlier in the
    session (the benches', the end-to-end tests') leaves it at WARNING."""
    handler = make_handler(settings, emit_metrics=emit_metrics, log_level=log_level)
    _environments.append(handler)
    try:
        yield handler
    finally:
        _environments.remove(handler)
        handler.close()


def current() -> WriterHandler:
    """The environment :func:`invoke` calls."""
    return _environments[-1]


def invoke(event: dict[str, Any]) -> list[str]:
    """Call the current environment's handler; returns the messageIds it asked to retry."""
    # A context as Lambda passes one: Powertools' inject_lambda_context reads it.
    response = current()(event, context_for(timeout_s=WRITER_TIMEOUT_S))
    assert set(response) == {"batchItemFailures"}
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def checkpoint_rows(url: str) -> list[Row]:
    """Every checkpoint row (without write timestamps), sorted; shards_present is the live count
    (training_checkpoint_progress: the row's part plus its count rows, migration 0006)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT {CHECKPOINT_COLUMNS} FROM training_checkpoint_progress ORDER BY job_id, step"
        ).fetchall()


def shard_rows(url: str) -> list[Row]:
    """Every shard row (without write timestamps and message ids), sorted."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT {SHARD_COLUMNS} FROM training_checkpoint_shards ORDER BY job_id, step, rank"
        ).fetchall()


# Per checkpoint, the values the writer keeps (migration 0012: the row's part plus its count rows
# of its attempt) beside the same sums recomputed from its shard rows at that attempt, and its
# oldest_run_attempt beside its shard rows' oldest attempt (it must not be above it).
_KEPT_AND_RECOUNTED = """
SELECT c.job_id, c.step, c.run_attempt,
       (SELECT ckpt_sum_values(x.v) FROM (
            SELECT c.value_sums
            UNION ALL
            SELECT k.value_sums FROM training_checkpoint_counts k
            WHERE k.job_id = c.job_id AND k.step = c.step AND k.run_attempt = c.run_attempt
        ) x(v)) AS kept,
       (SELECT coalesce(jsonb_object_agg(g.name, jsonb_build_array(g.total, g.n)), '{}')
        FROM (SELECT v.name, sum(v.value) AS total, count(*) AS n
              FROM training_checkpoint_shards s
              CROSS JOIN LATERAL ckpt_shard_values(s.loss::text::numeric, s.metrics) v
              WHERE s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
              GROUP BY v.name) g) AS recounted,
       c.oldest_run_attempt <= coalesce((
           SELECT min(s.run_attempt) FROM training_checkpoint_shards s
           WHERE s.job_id = c.job_id AND s.step = c.step), c.run_attempt) AS oldest_ok
FROM training_checkpoints c
"""


def values_not_kept(url: str) -> list[Row]:
    """The checkpoints whose kept values differ from their shard rows' or whose
    oldest_run_attempt is above an attempt of their shard rows (none, when the writer is right):
    jsonb compares the numbers as numbers, so the sums must be exactly equal."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT job_id, step, run_attempt, kept, recounted"
            f" FROM ({_KEPT_AND_RECOUNTED}) v WHERE kept <> recounted OR NOT oldest_ok"
            " ORDER BY 1, 2"
        ).fetchall()


def all_rows(url: str) -> tuple[list[Row], list[Row]]:
    """(checkpoint rows, shard rows)."""
    return checkpoint_rows(url), shard_rows(url)


def dlq_messages(sqs: Any, queues: PipelineQueues, expected: int) -> list[dict[str, Any]]:
    """Receive (and delete, to unlock their FIFO groups) up to ``expected`` DLQ messages."""
    got: list[dict[str, Any]] = []
    for _ in range(10):
        if len(got) >= expected:
            break
        batch = sqs.receive_message(
            QueueUrl=queues.dlq_url,
            **receive_kwargs(max_messages=10, wait_time_s=1, visibility_timeout_s=600),
        ).get("Messages", [])
        for message in batch:
            sqs.delete_message(QueueUrl=queues.dlq_url, ReceiptHandle=message["ReceiptHandle"])
        got.extend(batch)
    return got


# What moto's SQS puts in every message's SenderId, whoever sent it (moto/sqs/models.py,
# DEFAULT_SENDER_ID): the tests' one principal unless they stamp another (docs/DESIGN.md).
MOTO_SENDER_ID = "AIDAIT2UOQQY3AUEKVGXU"


def sqs_messages(
    bodies: Sequence[str], *, ids: Sequence[str] | None = None, sender_id: str = MOTO_SENDER_ID
) -> list[SqsMessage]:
    """Typed records without a queue (for tests that drive CheckpointWriter directly, fast)."""
    out = []
    for i, text in enumerate(bodies):
        message_id = ids[i] if ids is not None else str(uuid.uuid4())
        out.append(
            SqsMessage(
                message_id=message_id,
                body=text,
                group_id="g",
                receive_count=1,
                first_receive_ms=None,
                sequence_number=None,
                source_arn="arn:aws:sqs:us-east-1:000000000000:t-checkpoints.fifo",
                sender_id=sender_id,
            )
        )
    return out
