"""Packed messages (``ckpt.pack.v1``, a node's reports in one message) through the real writer:
every member written in one batch, a bad member parked alone with its reason, its neighbours
written, the message acknowledged; a replay of the pack or of its members changes nothing."""

from __future__ import annotations

import json
from typing import Any

from ckpt_contract.dlq import ERROR_CLASS, ERROR_MESSAGE, ORIGINAL_MESSAGE_ID
from ckpt_contract.pack import encode_pack, split_pack
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    body,
    checkpoint_rows,
    dlq_messages,
    invoke,
    shard_rows,
)


def _pack(ranks: range, world_size: int, *, step: int = 10) -> str:
    return encode_pack([body(rank=r, world_size=world_size, step=step) for r in ranks])


def test_packs_write_every_member_and_replays_are_no_ops(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN two nodes' packs of one 16-rank checkpoint
    event = make_event([Outgoing(_pack(range(8), 16)), Outgoing(_pack(range(8, 16), 16))])
    # WHEN written, THEN every shard is in and the checkpoint is complete
    assert invoke(event) == []
    assert [r[2] for r in shard_rows(writer_env)] == list(range(16))
    ((*_, present, complete),) = checkpoint_rows(writer_env)
    assert (present, complete) == (16, True)
    before = shard_rows(writer_env), checkpoint_rows(writer_env)
    # WHEN a pack and its members alone arrive again (a redelivery, a dead leader's ranks
    # resending on their own), THEN nothing changes
    alone = [Outgoing(body(rank=r, world_size=16, step=10)) for r in range(4)]
    again = make_event([Outgoing(_pack(range(8), 16)), *alone])
    assert invoke(again) == []
    assert (shard_rows(writer_env), checkpoint_rows(writer_env)) == before


def test_a_bad_member_is_parked_alone_and_its_neighbours_written(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN a pack whose third member breaks the contract (a negative step)
    members = [body(rank=r, world_size=4) for r in range(4)]
    bad = json.loads(members[2])
    bad["step"] = -1
    members[2] = json.dumps(bad)
    event = make_event([Outgoing(encode_pack(members))])
    (message_id,) = [r["messageId"] for r in event["Records"]]
    # WHEN written, THEN the message is acknowledged, the other three are in
    assert invoke(event) == []
    assert [r[2] for r in shard_rows(writer_env)] == [0, 1, 3]
    # AND the bad member alone is in the DLQ, as a plain report with its own reason and id
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    assert split_pack(parked["Body"]) is None and json.loads(parked["Body"])["rank"] == 2
    attributes = parked["MessageAttributes"]
    assert attributes[ORIGINAL_MESSAGE_ID]["StringValue"] == f"{message_id}#2"
    assert attributes[ERROR_CLASS]["StringValue"] == "InvalidMessage"
    assert "step" in attributes[ERROR_MESSAGE]["StringValue"]


def test_a_malformed_pack_is_poison_as_a_whole(
    writer_env: str, make_event: EventFactory, sqs: Any, pipeline_queues: PipelineQueues
) -> None:
    # GIVEN a body naming the pack schema without a list of reports, beside a valid report
    event = make_event(
        [Outgoing('{"schema":"ckpt.pack.v1","reports":7}'), Outgoing(body(rank=0), "job-a:9")]
    )
    # WHEN written, THEN the pack is parked whole with the field and rule, the report written
    assert invoke(event) == []
    (parked,) = dlq_messages(sqs, pipeline_queues, 1)
    assert "reports" in parked["MessageAttributes"][ERROR_MESSAGE]["StringValue"]
    assert len(shard_rows(writer_env)) == 1
