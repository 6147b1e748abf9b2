"""SQS: FIFO with explicit dedup ids, SSE, TLS-only policy, FIFO DLQ with 14 days, redrive."""

from __future__ import annotations

from typing import Any

from infra import constants
from tests.infra.conftest import Synth

MAIN, DLQ = "main", "dlq"


def _queue(synth: Synth, which: str) -> dict[str, Any]:
    # The main queue is the one with a redrive policy; the DLQ is its target.
    (main,) = [
        r["Properties"]
        for r in synth.resources("AWS::SQS::Queue").values()
        if "RedrivePolicy" in r["Properties"]
    ]
    if which == MAIN:
        return dict(main)
    dlq_id = main["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
    return dict(synth.json["Resources"][dlq_id]["Properties"])


def test_cloudformation_names_the_queues(any_synth: Synth) -> None:
    # Fixed names would block replacements and a second stack in the account (issue 13 item 5).
    for props in (_queue(any_synth, MAIN), _queue(any_synth, DLQ)):
        assert "QueueName" not in props


def test_main_queue_is_fifo_with_explicit_dedup_and_sse(any_synth: Synth) -> None:
    props = _queue(any_synth, MAIN)
    assert props["FifoQueue"] is True
    assert props["ContentBasedDeduplication"] is False
    assert props["SqsManagedSseEnabled"] is True
    assert props["MessageRetentionPeriod"] == constants.QUEUE_RETENTION_S
    assert props["VisibilityTimeout"] == 6 * constants.WRITER_TIMEOUT_S


def test_high_throughput_settings_follow_context(greenfield: Synth, existing: Synth) -> None:
    ht = _queue(greenfield, MAIN)
    assert ht["DeduplicationScope"] == "messageGroup"
    assert ht["FifoThroughputLimit"] == "perMessageGroupId"
    normal = _queue(existing, MAIN)
    assert "DeduplicationScope" not in normal
    assert "FifoThroughputLimit" not in normal


def test_dlq_is_fifo_14_days_encrypted(any_synth: Synth) -> None:
    props = _queue(any_synth, DLQ)
    assert props["FifoQueue"] is True
    assert props["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert props["SqsManagedSseEnabled"] is True


def test_redrive_count_follows_reserved_concurrency(greenfield: Synth, existing: Synth) -> None:
    for synth, expected in (
        (greenfield, constants.MAX_RECEIVE_COUNT),
        (existing, constants.MAX_RECEIVE_COUNT_RESERVED_1),
    ):
        redrive = _queue(synth, MAIN)["RedrivePolicy"]
        assert redrive["maxReceiveCount"] == expected >= 5
        assert "Fn::GetAtt" in redrive["deadLetterTargetArn"]


def test_both_queues_deny_non_tls(any_synth: Synth) -> None:
    policies = any_synth.resources("AWS::SQS::QueuePolicy")
    assert len(policies) == 2
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert {
            "Effect": "Deny",
            "Action": "sqs:*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            "Principal": {"AWS": "*"},
        }.items() <= statements[0].items()
