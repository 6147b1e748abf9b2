"""Reports packed per node against moto's server: a node's ranks through its leader's relay (one
message per pack, every report in once), a rank that reports late, and a dead leader."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract.pack import split_pack
from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.trainer_client.helpers import drain
from trainer_client import CheckpointReporter
from trainer_client.report.pack_relay import PackClient, PackRelay, PackRelayServer


@pytest.fixture
def relay(sqs: Any, pipeline_queues: PipelineQueues) -> Iterator[PackRelayServer]:
    server = PackRelayServer(PackRelay(sqs, pipeline_queues.queue_url, linger_s=0.2))
    yield server
    server.close()


def _rank(
    queues: PipelineQueues, spool: Path, sqs: Any, address: str, rank: int
) -> tuple[CheckpointReporter, PackClient]:
    client = PackClient(address, sqs, timeout_s=5.0)
    reporter = CheckpointReporter(
        queues.queue_url, job_id="job-p", spool_dir=spool, rank=rank, world_size=8,
        sqs_client=client, spot_poll=False,
    )  # fmt: skip
    return reporter, client


def _reports(messages: list[dict[str, Any]]) -> list[int]:
    ranks = []
    for m in messages:
        members = split_pack(m["Body"]) or [m["Body"]]
        ranks += [json.loads(b)["rank"] for b in members]
    return sorted(ranks)


@pytest.fixture
def relay_of_seven(sqs: Any, pipeline_queues: PipelineQueues) -> Iterator[PackRelayServer]:
    """A relay that packs once 7 reports are there (the longest linger as the backstop)."""
    server = PackRelayServer(PackRelay(sqs, pipeline_queues.queue_url, max_reports=7, linger_s=5))
    yield server
    server.close()


def test_a_node_sends_one_pack_and_a_late_rank_the_next(
    relay_of_seven: PackRelayServer, sqs: Any, pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN the 8 ranks of a node, each its own reporter and connection to the leader's relay,
    # which packs when the seven are there (with a 0.2 s linger, under stress-ng the seven
    # senders' reports arrived as 1 and then 6: two packs)
    relay = relay_of_seven
    ranks = [_rank(pipeline_queues, tmp_path, sqs, relay.address, r) for r in range(8)]
    # WHEN seven report at the barrier and the eighth after they were acknowledged (no linger
    # left for it: it is alone)
    for reporter, _ in ranks[:7]:
        reporter.report(step=10, epoch=1, uri="s3://b/10")
    assert all(reporter.flush(10) for reporter, _ in ranks[:7])
    relay.relay.linger_s = 0
    late, _ = ranks[7]
    late.report(step=10, epoch=1, uri="s3://b/10")
    assert late.flush(10)
    for reporter, _ in ranks:
        reporter.close()
    # THEN SQS got two packs: the seven together, the late rank in the next; each report once
    messages = drain(sqs, pipeline_queues.queue_url, expect=2)
    assert _reports(messages) == list(range(8))
    assert sorted(len(split_pack(m["Body"]) or []) for m in messages) == [1, 7]
    assert all(client.fallbacks == 0 for _, client in ranks)


def test_a_dead_leader_costs_its_ranks_their_own_sends(
    relay: PackRelayServer, sqs: Any, pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN two ranks connected to their leader, which then dies
    ranks = [_rank(pipeline_queues, tmp_path, sqs, relay.address, r) for r in range(2)]
    ranks[0][0].report(step=10, epoch=1, uri="s3://b/10")
    assert ranks[0][0].flush(10)
    relay.close()
    # WHEN both report the next checkpoint
    for reporter, _ in ranks:
        reporter.report(step=20, epoch=2, uri="s3://b/20")
    # THEN each sends its own report to SQS: nothing is lost, nothing waits for the leader
    assert all(reporter.flush(10) for reporter, _ in ranks)
    for reporter, _ in ranks:
        reporter.close()
    messages = drain(sqs, pipeline_queues.queue_url, expect=3)
    assert _reports(messages) == [0, 0, 1]
    assert [client.fallbacks for _, client in ranks] == [1, 1]


def test_a_hung_leader_costs_one_timeout_then_direct_sends(
    sqs: Any, pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN a leader that accepts connections and never answers (hung, not dead)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        address = f"127.0.0.1:{hung.getsockname()[1]}"
        client = PackClient(address, sqs, timeout_s=0.5)
        reporter = CheckpointReporter(
            pipeline_queues.queue_url, job_id="job-p", spool_dir=tmp_path, rank=0, world_size=8,
            sqs_client=client, spot_poll=False,
        )  # fmt: skip
        # WHEN the rank reports, THEN its report reaches SQS after one relay timeout
        reporter.report(step=10, epoch=1, uri="s3://b/10")
        assert reporter.flush(10)
        reporter.close()
    assert _reports(drain(sqs, pipeline_queues.queue_url, expect=1)) == [0]
    assert client.fallbacks == 1
