"""Scenario 5: poison bodies mixed into valid traffic, in the valid reports' own message groups."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_contract import MAX_BODY_BYTES, group_id
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import fleet, report_body, send_raw, settle, take_dlq
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import check_database, expected_state
from trainer_client.report.pack_relay import LocalPackClient, PackRelay

pytestmark = pytest.mark.slow

JOB = "e2e-poison"
RANKS = 2
STEPS = 6
# SQS's own limit per message is 1 MiB
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
SQS_MAX_MESSAGE_BYTES = 1024 * 1024
SQL_INJECTION = "x'); DROP TABLE training_checkpoint_shards; --"


@dataclass(frozen=True)
class PoisonCase:
    """A body that must land in the DLQ with ``error_class`` and a message naming ``mentions``."""

    name: str
    body: str
    error_class: str
    mentions: str


def _fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "schema": "ckpt.v1",
        "job_id": JOB,
        "run_attempt": 0,
        "step": 900,
        "epoch": 1,
        "rank": 0,
        "world_size": RANKS,
        "uri": "s3://bucket/poison",
        "loss": 0.5,
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    fields.update(overrides)
    return fields


def _json(**overrides: Any) -> str:
    # json.dumps writes NaN / Infinity literals (not JSON, but what a sloppy client sends).
    return json.dumps(_fields(**overrides), ensure_ascii=False)


def poison_cases() -> list[PoisonCase]:
    """One body per kind of poison; every one of them has a valid neighbour in its group."""
    oversize = _json(blob="x" * (MAX_BODY_BYTES + 1024))
    assert MAX_BODY_BYTES < len(oversize.encode()) < SQS_MAX_MESSAGE_BYTES
    return [
        PoisonCase("malformed JSON", '{"schema": "ckpt.v1", "job_id": "e2e-poison", "step": 1,',
                   "UndecodableBody", "Invalid JSON"),
        PoisonCase("not an object", "[1, 2, 3]", "UndecodableBody", "object"),
        PoisonCase("NaN loss", _json(loss=float("nan")), "InvalidMessage", "loss"),
        PoisonCase("Infinity metric", _json(metrics={"acc": float("inf")}), "InvalidMessage",
                   "metrics"),
        PoisonCase("overflowing number", _json(loss=1).replace('"loss": 1', '"loss": 1e999'),
                   "InvalidMessage", "loss"),
        PoisonCase("oversize (> 64 KiB, < 1 MiB)", oversize, "MessageTooLarge", "exceeds"),
        PoisonCase("step as string", _json(step="5"), "InvalidMessage", "step"),
        PoisonCase("rank as boolean", _json(rank=True), "InvalidMessage", "rank"),
        PoisonCase("rank >= world_size", _json(rank=RANKS), "InvalidMessage", "rank"),
        PoisonCase("uri missing", json.dumps({k: v for k, v in _fields().items() if k != "uri"}),
                   "InvalidMessage", "uri"),
        PoisonCase("unknown schema", _json(schema="ckpt.v2"), "UnknownSchema", "schema"),
        PoisonCase("SQL injection in job_id", _json(job_id=SQL_INJECTION), "InvalidMessage",
                   "job_id"),
        PoisonCase("non-ASCII job_id (Latin)", _json(job_id="jöb-ünïcode"), "InvalidMessage",
                   "job_id"),
        PoisonCase("non-ASCII job_id (CJK)", _json(job_id="训练作业-7"), "InvalidMessage",
                   "job_id"),
    ]  # fmt: skip


@pytest.mark.parametrize("intake", ["per-rank", "packed"])
def test_poison_mixed_into_valid_traffic(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path, intake: str
) -> None:
    cases = poison_cases()
    # Valid bodies from another client, sent raw: a URI that is SQL text (stored verbatim, not
    # run) and a field this writer does not know yet (kept in `extra`).
    injection_body, injection = report_body(
        job_id=JOB, step=100, rank=0, world_size=1, uri=f"s3://bucket/{SQL_INJECTION}"
    )
    future_body, future = report_body(
        job_id=JOB, step=101, rank=0, world_size=1, future_field={"k": "v"}
    )
    with contextlib.ExitStack() as stack:
        pipeline = stack.enter_context(pipeline_factory())
        packing: dict[str, Any] = {}
        if intake == "packed":
            # The ranks' valid reports go out packed by a node leader's relay, poison raw.
            relay = PackRelay(pipeline.sqs, pipeline.queues.queue_url, linger_s=0.05)
            stack.callback(relay.close)
            packing["sqs_client"] = LocalPackClient(relay)
        ranks = stack.enter_context(
            fleet(pipeline, job_id=JOB, ranks=RANKS, spool_dir=tmp_path, **packing)
        )
        # GIVEN reporter traffic with poison interleaved in the same message groups
        q = pipeline.queues.queue_url
        for i, case in enumerate(cases):
            if i < STEPS:
                ranks.report_step(i)
            send_raw(pipeline.sqs, q, case.body, group_id=group_id(JOB, i % RANKS))
        send_raw(pipeline.sqs, q, injection_body, group_id=group_id(JOB, 0))
        send_raw(pipeline.sqs, q, future_body, group_id=group_id(JOB, 1))
        assert ranks.flush(timeout=60)
        stats = settle(pipeline)
        dead = take_dlq(pipeline)

    sent = [*ranks.sent, injection, future]
    check = check_database(pipeline.database_url, expected_state(sent))
    by_body = {m["Body"]: m for m in dead}
    reasons: dict[str, tuple[str | None, str]] = {}
    for case in cases:
        attributes = by_body.get(case.body, {}).get("MessageAttributes", {})
        reasons[case.name] = (
            attributes.get("ErrorClass", {}).get("StringValue"),
            attributes.get("ErrorMessage", {}).get("StringValue", ""),
        )
    with psycopg.connect(pipeline.database_url) as conn:
        stored = conn.execute(
            "SELECT uri, extra FROM training_checkpoint_shards WHERE job_id = %s AND step = %s",
            (JOB, 101),
        ).fetchone()
        tables = {
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'training_checkpoint%%'"
            )
        }
    fault_matrix.record(
        FaultRow.of(
            "5 poison mixed into valid traffic" + (" (packs)" if packing else ""),
            reports_sent=len(sent) + len(cases),
            check=check,
            in_dlq=len(dead),
            poison_kinds=len(cases),
            deliveries=stats.records,
        )
    )
    # THEN each poison body is in the DLQ once, with its reason; nothing valid is there
    assert sorted(m["Body"] for m in dead) == sorted(c.body for c in cases)
    for case in cases:
        error_class, message = reasons[case.name]
        assert error_class == case.error_class, (case.name, error_class, message)
        assert case.mentions in message, (case.name, message)
    # ... and every valid neighbour is written, the SQL-looking URI verbatim, the tables intact
    assert check.problems == []
    assert stored is not None and stored[1] == {"future_field": {"k": "v"}}
    assert tables == {
        "training_checkpoints",
        "training_checkpoint_shards",
        "training_checkpoint_counts",
        "training_checkpoint_tombstones",
        "training_checkpoint_manifests",
    }
