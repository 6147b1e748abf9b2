"""The circuit breaker end to end: a PostgreSQL outage longer than maxReceiveCount receives sends
nothing to the DLQ, with every rank's own message and with reports packed by a node leader.

The local event source honours the writer's event source mapping (moto's Lambda API over HTTP)
as Lambda does: no polling while it is disabled. The deployed breaker code
(``lambda_writer.breaker.circuit.run_breaker``, every minute in AWS) runs on a short schedule here,
with the writer's own login. The fault: the writer's role gets CONNECTION LIMIT 0 and its
connections are terminated (the recipe of ``test_postgres_faults``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import psycopg
import pytest

from ckpt_contract import dedup_id, group_id
from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.local.receive_gate import MappingGate, create_local_mapping
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer.breaker.circuit import BreakerRun, check_database, mapping_switch, run_breaker
from lambda_writer.shared.settings import WriterSettings
from tests.e2e.conftest import PipelineFactory, WriterRole
from tests.e2e.helpers import VISIBILITY_TIMEOUT_S, report_body, settle
from tests.trainer_client.helpers import wait_for
from trainer_client.report.pack_relay import PackRelay
from trainer_client.report.sender import send_entry

pytestmark = pytest.mark.slow

# Below the deployed 5 (lambda_writer.shared.constants), so that the outage outlasts it quickly.
MAX_RECEIVE_COUNT = 3
# The breaker's schedule here (1 minute in AWS: far below the deployed 180 s visibility timeout,
# as 0.5 s is below the local 3 s, so a message is received at most once before the mapping is
# disabled).
BREAKER_INTERVAL_S = 0.5
RANKS = 4


class BreakerSchedule:
    """``run_breaker`` every ``interval_s`` on a thread: the EventBridge rule's stand-in."""

    def __init__(self, role_url: str, mapping_uuid: str, region: str) -> None:
        settings = WriterSettings(database_url=role_url)
        self._check = lambda: check_database(settings)
        self._switch = mapping_switch(mapping_uuid, region=region)
        self.runs: list[BreakerRun] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="breaker-schedule", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(BREAKER_INTERVAL_S):
            self.runs.append(run_breaker(self._check, self._switch))

    def actions(self) -> list[str]:
        return [r.decision.action for r in self.runs if r.decision.action != "none"]

    def open_runs(self) -> int:
        return sum(r.decision.breaker_open for r in self.runs)

    @contextmanager
    def running(self) -> Iterator[BreakerSchedule]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def _rows(pipeline: LocalPipeline, job: str) -> int:
    with psycopg.connect(pipeline.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM training_checkpoint_shards WHERE job_id = %s", (job,)
        ).fetchone()
    return int(row[0]) if row else 0


def _send_step(pipeline: LocalPipeline, job: str, step: int, relay: PackRelay | None) -> None:
    """Every rank's report of ``step``: each its own message, or through a node leader's relay
    (one pack), with the ids a rank's sender gives them."""
    entries = []
    for rank in range(RANKS):
        body, _ = report_body(job_id=job, step=step, rank=rank, world_size=RANKS)
        ids = {"group": group_id(job, rank), "dedup": dedup_id(job, 0, step, rank)}
        entries.append(send_entry(step, body, **ids))
    queue_url = pipeline.queues.queue_url
    for client, batch in (
        [(pipeline.sqs, [e]) for e in entries] if relay is None else [(relay, entries)]
    ):
        response = client.send_message_batch(QueueUrl=queue_url, Entries=batch)
        assert not response.get("Failed"), response


@pytest.mark.parametrize("intake", ["per-rank", "packed"])
def test_outage_longer_than_max_receive_count_sends_nothing_to_the_dlq(
    pipeline_factory: PipelineFactory, writer_role: WriterRole, intake: str
) -> None:
    # packed: each step's reports are one pack (a node leader's message); the breaker holds
    # packs as it holds reports, and they land whole once the database is back.
    job = f"e2e-breaker-{intake}"
    messages = RANKS if intake == "per-rank" else 1  # per step
    with pipeline_factory(
        writer_database_url=writer_role.url, max_receive_count=MAX_RECEIVE_COUNT, start=False
    ) as p:
        session = boto3.session.Session()
        clients = {n: session.client(n, endpoint_url=p.endpoint_url) for n in ("lambda", "iam")}
        mapping = create_local_mapping(clients["lambda"], p.sqs, clients["iam"], prefix=job)
        gate = MappingGate(clients["lambda"], mapping.uuid, refresh_s=0.2)
        p.source.gate = gate
        schedule = BreakerSchedule(writer_role.url, mapping.uuid, session.region_name)
        relay = None if intake == "per-rank" else PackRelay(p.sqs, p.queues.queue_url)
        with p.source, schedule.running():
            # GIVEN a warm writer: connected, the first step written
            _send_step(p, job, 0, relay)
            wait_for(lambda: _rows(p, job) == RANKS, timeout=60)
            # WHEN the writer's role may not connect and its connections are gone
            writer_role.set_connection_limit(0)
            try:
                writer_role.terminate_backends()
                _send_step(p, job, 1, relay)
                _send_step(p, job, 2, relay)
                # THEN the breaker opens: the mapping is disabled and the source stops polling
                wait_for(lambda: schedule.actions() == ["disable"], timeout=60)
                wait_for(lambda: gate.paused > 0, timeout=30)
                # ... every failed record is back in the queue and nobody receives it ...
                wait_for(lambda: queue_depth(p.sqs, p.queues.queue_url).in_flight == 0, 60)
                # ... and the outage lasts longer than maxReceiveCount visibility timeouts
                # (counted in breaker runs that found the database down, not in wall time).
                runs_needed = int(MAX_RECEIVE_COUNT * VISIBILITY_TIMEOUT_S / BREAKER_INTERVAL_S)
                wait_for(lambda: schedule.open_runs() > runs_needed, timeout=120)
                depth = queue_depth(p.sqs, p.queues.queue_url)
                assert (depth.visible, depth.in_flight) == (2 * messages, 0)
                assert p.dlq_depth() == 0
                assert _rows(p, job) == RANKS
                state = clients["lambda"].get_event_source_mapping(UUID=mapping.uuid)["State"]
                assert state == "Disabled"
            finally:
                writer_role.set_connection_limit(-1)
            # WHEN the database is back, THEN the breaker closes and every record lands
            wait_for(lambda: schedule.actions() == ["disable", "enable"], timeout=60)
            wait_for(lambda: _rows(p, job) == 3 * RANKS, timeout=60)
            settle(p)
        if relay is not None:
            relay.close()
        stats = p.source.stats
        print(  # the figures, under `pytest -s`
            f"breaker runs={len(schedule.runs)} open={schedule.open_runs()}"
            f" actions={schedule.actions()} deliveries={stats.records}"
            f" failed={stats.failed_records} gate_pauses={gate.paused} dlq={p.dlq_depth()}"
        )
        assert p.dlq_depth() == 0
        assert p.source.stats.failed_records <= 2 * messages  # at most one failed receive each
        state = clients["lambda"].get_event_source_mapping(UUID=mapping.uuid)["State"]
        assert state == "Enabled"
