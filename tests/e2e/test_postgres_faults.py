"""Scenario 4: PostgreSQL unreachable, its writer connections killed, the writer role capped at 0.

The writer logs in as a fresh non-superuser role (a member of ``ckpt_writer``). With
maxReceiveCount 2, records that keep failing reach the DLQ through SQS's redrive; ``replay_dlq``
brings them back once the database is healthy, and the database ends exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.demo.fanin import count_rows
from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.local.tcp_relay import TcpRelay
from ckpt_pipeline.ops.replay import ReplaySummary
from tests.e2e.conftest import PipelineFactory, WriterRole
from tests.e2e.helpers import Fleet, fleet, replay_and_settle, settle
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import DatabaseCheck, check_database, expected_state
from tests.trainer_client.helpers import wait_for
from trainer_client.report.pack_relay import LocalPackClient, PackRelay

pytestmark = pytest.mark.slow

RANKS = 4
WARM_STEPS = 2
FAULT_STEPS = 4
MAX_RECEIVE_COUNT = 2
DLQ_WAIT_S = 60.0


@contextmanager
def _pipeline_and_ranks(
    pipeline_factory: PipelineFactory, writer_url: str, job: str, spool: Path, *,
    packed: bool = False,
) -> Iterator[tuple[LocalPipeline, Fleet]]:  # fmt: skip
    """The pipeline and its ranks; ``packed``: the ranks send through a node leader's relay."""
    with ExitStack() as stack:
        p = stack.enter_context(
            pipeline_factory(writer_database_url=writer_url, max_receive_count=MAX_RECEIVE_COUNT)
        )
        packing: dict[str, Any] = {}
        if packed:
            relay = PackRelay(p.sqs, p.queues.queue_url, linger_s=0.05)
            stack.callback(relay.close)
            packing["sqs_client"] = LocalPackClient(relay)
        ranks = stack.enter_context(fleet(p, job_id=job, ranks=RANKS, spool_dir=spool, **packing))
        # GIVEN a warm writer: connected, first checkpoints written
        ranks.report_steps(range(WARM_STEPS))
        wait_for(lambda: count_rows(p.database_url, job)[0] == RANKS * WARM_STEPS, timeout=30)
        yield p, ranks


def _fault_steps(ranks: Fleet) -> None:
    ranks.report_steps(range(WARM_STEPS, WARM_STEPS + FAULT_STEPS), every_s=0.2)


def _held_until_redriven(pipeline: LocalPipeline, job: str) -> int:
    """Keep the fault until SQS moved records to the DLQ; returns the rows written meanwhile."""
    wait_for(lambda: pipeline.dlq_depth() > 0, timeout=DLQ_WAIT_S, interval=0.2)
    return count_rows(pipeline.database_url, job)[0]


def _recover(pipeline: LocalPipeline, ranks: Fleet) -> tuple[int, int, ReplaySummary]:
    """Flush, wait for the writer, replay the DLQ; returns (failed deliveries, in DLQ, replay)."""
    assert ranks.flush(timeout=60)
    settle(pipeline)
    in_dlq = pipeline.dlq_depth()
    summary = replay_and_settle(pipeline)
    return pipeline.source.stats.failed_records, in_dlq, summary


def _record(
    fault_matrix: FaultMatrix,
    scenario: str,
    ranks: Fleet,
    pipeline: LocalPipeline,
    in_dlq: int,
    summary: ReplaySummary,
    **figures: object,
) -> DatabaseCheck:
    check = check_database(pipeline.database_url, expected_state(ranks.sent))
    fault_matrix.record(
        FaultRow.of(
            scenario,
            reports_sent=len(ranks.sent),
            check=check,
            in_dlq=in_dlq,
            replayed=summary.moved,
            deliveries=pipeline.source.stats.records,
            **figures,
        )
    )
    return check


def _assert_recovered(
    check: DatabaseCheck, ranks: Fleet, in_dlq: int, summary: ReplaySummary, dlq_after: int
) -> None:
    assert ranks.report_errors == []
    assert summary.moved == in_dlq and summary.failed == 0 and summary.skipped == 0
    # Transient failures are never poison: everything in the DLQ came by maxReceiveCount
    assert all(item.message.error_class is None for item in summary.items)
    assert dlq_after == 0
    assert check.problems == []
    assert check.complete_found == WARM_STEPS + FAULT_STEPS


@pytest.mark.parametrize("intake", ["per-rank", "packed"])
def test_postgres_unreachable(
    pipeline_factory: PipelineFactory,
    writer_role: WriterRole,
    fault_matrix: FaultMatrix,
    tmp_path: Path,
    intake: str,
) -> None:
    # packed: whole packs reach the DLQ by maxReceiveCount and are replayed as packs
    job = "e2e-pg-unreachable"
    params = psycopg.conninfo.conninfo_to_dict(writer_role.url)
    relay = TcpRelay((str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))))
    writer_url = psycopg.conninfo.make_conninfo(
        writer_role.url, host="127.0.0.1", port=str(relay.port)
    )
    packed = intake == "packed"
    with (
        relay,
        _pipeline_and_ranks(pipeline_factory, writer_url, job, tmp_path, packed=packed) as (
            p,
            ranks,
        ),
    ):
        # WHEN the database's port closes (and the writer's open connection dies with it)
        relay.stop()
        _fault_steps(ranks)
        rows_during = _held_until_redriven(p, job)
        relay.start()
        # THEN retries, redrive and one replay put every report in exactly once
        failed, in_dlq, summary = _recover(p, ranks)
        dlq_after = p.dlq_depth()
    check = _record(
        fault_matrix,
        "4a PostgreSQL unreachable" + (" (packs)" if packed else ""),
        ranks,
        p,
        in_dlq,
        summary,
        failed_deliveries=failed,
    )
    assert rows_during == RANKS * WARM_STEPS
    assert failed > 0 and in_dlq > 0
    _assert_recovered(check, ranks, in_dlq, summary, dlq_after)


def _more_than(counts: list[int], floor: int) -> Callable[[], bool]:
    return lambda: sum(counts) > floor


def test_writer_connections_killed_repeatedly(
    pipeline_factory: PipelineFactory,
    writer_role: WriterRole,
    fault_matrix: FaultMatrix,
    tmp_path: Path,
) -> None:
    job = "e2e-pg-terminated"
    killed: list[int] = []
    stop = threading.Event()

    def kill_loop() -> None:
        while not stop.wait(0.1):
            killed.append(writer_role.terminate_backends())

    with _pipeline_and_ranks(pipeline_factory, writer_role.url, job, tmp_path) as (p, ranks):
        # WHEN every writer connection is terminated every 100 ms while the ranks report
        killer = threading.Thread(target=kill_loop, name="pg-terminator")
        killer.start()
        try:
            for step in range(WARM_STEPS, WARM_STEPS + FAULT_STEPS):
                # Each step's batch needs a connection, which the killer then finds: so every
                # step is written across at least one terminated connection.
                one_more_kill = _more_than(killed, sum(killed))
                ranks.report_step(step)
                wait_for(one_more_kill, timeout=30)
            assert ranks.flush(timeout=60)
        finally:
            stop.set()
            killer.join()
        failed, in_dlq, summary = _recover(p, ranks)
        dlq_after = p.dlq_depth()
    check = _record(
        fault_matrix,
        "4b writer connections killed (pg_terminate_backend)",
        ranks,
        p,
        in_dlq,
        summary,
        backends_terminated=sum(killed),
        failed_deliveries=failed,
    )
    assert sum(killed) >= FAULT_STEPS
    _assert_recovered(check, ranks, in_dlq, summary, dlq_after)


def test_writer_role_connection_limit_zero(
    pipeline_factory: PipelineFactory,
    writer_role: WriterRole,
    fault_matrix: FaultMatrix,
    tmp_path: Path,
) -> None:
    job = "e2e-pg-conn-limit"
    restore: Callable[[], None] = lambda: writer_role.set_connection_limit(-1)  # noqa: E731
    with _pipeline_and_ranks(pipeline_factory, writer_role.url, job, tmp_path) as (p, ranks):
        # WHEN the writer's role may open no connection, and its current one is gone
        writer_role.set_connection_limit(0)
        try:
            writer_role.terminate_backends()
            _fault_steps(ranks)
            rows_during = _held_until_redriven(p, job)
        finally:
            restore()
        failed, in_dlq, summary = _recover(p, ranks)
        dlq_after = p.dlq_depth()
    check = _record(
        fault_matrix,
        "4c writer role CONNECTION LIMIT 0",
        ranks,
        p,
        in_dlq,
        summary,
        failed_deliveries=failed,
    )
    assert rows_during == RANKS * WARM_STEPS
    assert failed > 0 and in_dlq > 0
    _assert_recovered(check, ranks, in_dlq, summary, dlq_after)
