"""Replay decisions without I/O: dedup ids, filters, lenient job parsing."""

from __future__ import annotations

from typing import Any

from ckpt_contract.dlq import dlq_dedup_id
from ckpt_pipeline.ops.replay_plan import (
    DLQ_DEDUP_ATTR,
    MAX_DEDUP_ID_CHARS,
    NO_REASON,
    DlqMessage,
    ReplayFilter,
    compile_reason,
    decide_replay,
    job_id_of,
    move_task_refusal,
    replay_identity,
    replay_message_attributes,
    requeue_entry,
    requeue_tag,
)


def _msg(
    *,
    body: str = '{"job_id": "j1"}',
    dedup: str | None = "abc",
    attrs: dict[str, str] | None = None,
) -> DlqMessage:
    message_attributes: dict[str, Any] = {
        k: {"DataType": "String", "StringValue": v} for k, v in (attrs or {}).items()
    }
    return DlqMessage(
        message_id="mid-1",
        receipt_handle="rh",
        body=body,
        group_id="j1:0",
        dedup_id=dedup,
        receive_count=7,
        message_attributes=message_attributes,
    )


def test_first_replay_appends_replay_1_and_does_not_depend_on_receive_count() -> None:
    first = replay_identity(_msg())
    assert first.dedup_id == "abc:replay:1"
    again = _msg()
    assert replay_identity(DlqMessage(**{**again.__dict__, "receive_count": 99})) == first


def test_a_replayed_message_back_in_the_dlq_gets_the_next_number() -> None:
    identity = replay_identity(_msg())
    attrs = replay_message_attributes(_msg(attrs={"ErrorClass": "X", "Keep": "k"}), identity)
    assert "ErrorClass" not in attrs and attrs["Keep"]["StringValue"] == "k"
    back = _msg(
        dedup="abc:replay:1",
        attrs={k: v["StringValue"] for k, v in attrs.items()},
    )
    assert replay_identity(back).dedup_id == "abc:replay:2"
    # Without our attributes (e.g. re-poisoned by a writer that drops them) the suffix is read.
    assert replay_identity(_msg(dedup="abc:replay:4")).dedup_id == "abc:replay:5"


def test_long_ids_are_hashed_within_sqs_limit() -> None:
    identity = replay_identity(_msg(dedup="x" * 128))
    assert len(identity.dedup_id) <= MAX_DEDUP_ID_CHARS
    assert identity.dedup_id.endswith(":replay:1")
    assert identity == replay_identity(_msg(dedup="x" * 128))


def test_no_dedup_id_falls_back_to_the_message_id() -> None:
    assert replay_identity(_msg(dedup=None)).dedup_id == "mid-1:replay:1"


def test_job_parsing_is_lenient() -> None:
    assert job_id_of('{"job_id": "j"}') == "j"
    assert job_id_of("not json") is None
    assert job_id_of("[1, 2]") is None
    assert job_id_of('{"job_id": 3}') is None


def test_reason_and_job_filters_and_limit() -> None:
    poison = _msg(attrs={"ErrorClass": "InvalidMessage", "ErrorMessage": "loss: not finite"})
    assert poison.reason == "InvalidMessage: loss: not finite"
    assert _msg().reason == NO_REASON
    assert (
        decide_replay(poison, ReplayFilter(job="j1"), selected_so_far=0, limit=None).action
        == "move"
    )
    assert (
        decide_replay(poison, ReplayFilter(job="j2"), selected_so_far=0, limit=None).action
        == "skip"
    )
    by_reason = ReplayFilter(reason=compile_reason("invalidmessage.*finite"))
    assert decide_replay(poison, by_reason, selected_so_far=0, limit=None).action == "move"
    assert decide_replay(_msg(), by_reason, selected_so_far=0, limit=None).action == "skip"
    assert (
        decide_replay(poison, ReplayFilter(), selected_so_far=2, limit=2).why == "beyond --limit 2"
    )
    # Not a valid regex: taken as a substring.
    assert compile_reason("loss: not finite (").search("x loss: not finite ( y")


def test_a_requeued_copy_keeps_body_group_attributes_and_replay_identity() -> None:
    original = _msg(attrs={"ErrorClass": "InvalidMessage"})
    entry = requeue_entry(original, "run1", "0")
    assert entry is not None
    assert entry["MessageDeduplicationId"].startswith(requeue_tag("run1"))
    assert (entry["MessageBody"], entry["MessageGroupId"]) == (original.body, original.group_id)
    attrs = {k: v["StringValue"] for k, v in entry["MessageAttributes"].items()}
    assert attrs == {"ErrorClass": "InvalidMessage", DLQ_DEDUP_ATTR: "abc"}
    copy = _msg(dedup=entry["MessageDeduplicationId"], attrs=attrs)
    assert replay_identity(copy) == replay_identity(original)
    assert DLQ_DEDUP_ATTR not in replay_message_attributes(copy, replay_identity(copy))
    # No room for one more attribute (SQS allows 10): not re-queued.
    assert requeue_entry(_msg(attrs={f"a{i}": "v" for i in range(10)}), "run1", "0") is None


def test_move_task_is_refused_unless_no_move_can_be_deduplicated_away() -> None:
    def redriven(dedup: str) -> DlqMessage:
        return DlqMessage("mid-1", "rh", "{}", "g", dedup, 1)

    writer = _msg(
        dedup=dlq_dedup_id("orig"), attrs={"ErrorClass": "E", "OriginalMessageId": "orig"}
    )
    assert move_task_refusal([redriven("mid-1"), writer], whole_dlq=False) is None
    assert move_task_refusal([writer], whole_dlq=True) is None
    assert move_task_refusal([writer], whole_dlq=False) is not None  # no evidence either way
    assert "'producer-id'" in str(move_task_refusal([redriven("producer-id")], whole_dlq=True))
    assert move_task_refusal([], whole_dlq=True) is not None
