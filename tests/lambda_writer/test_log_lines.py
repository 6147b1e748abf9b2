"""The writer's per-record log line says what the record did: written, unchanged or dropped.

Through the real handler, on real SQS event shapes received from moto's FIFO queue, against the
real database; the lines read back as Lambda's log group would hold them (Powertools' JSON).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator

import pytest

from lambda_writer.shared.settings import WriterSettings
from tests.lambda_writer.helpers import EventFactory, body, environment, invoke

WRITTEN = "record written"
UNCHANGED = "record unchanged: its shard row already holds this or a newer attempt"
Lines = Callable[[], list[tuple[str, int, int]]]


@pytest.fixture
def record_lines(writer_settings: WriterSettings) -> Iterator[Lines]:
    """One environment of the writer at INFO (as deployed); reads back its per-record lines
    (message, rank, run_attempt) from its JSON log."""
    from lambda_writer.writer import handler as handler_module

    stream = io.StringIO()
    sink = logging.StreamHandler(stream)
    sink.setFormatter(handler_module.logger.registered_formatter)
    std_logger = logging.getLogger("ckpt-writer")
    std_logger.addHandler(sink)

    def read() -> list[tuple[str, int, int]]:
        lines = [json.loads(x) for x in stream.getvalue().splitlines()]
        stream.seek(0)
        stream.truncate()
        return [
            (x["message"], x["rank"], x["run_attempt"])
            for x in lines
            if str(x.get("message", "")).startswith("record ")
        ]

    try:
        with environment(writer_settings, log_level="INFO"):
            yield read
    finally:
        std_logger.removeHandler(sink)


def test_a_report_that_changed_nothing_is_logged_unchanged_not_written(
    record_lines: Lines, make_event: EventFactory
) -> None:
    # GIVEN ranks 0 and 1 of step 100 written (attempt 1)
    assert invoke(make_event([body(rank=0, run_attempt=1), body(rank=1, run_attempt=1)])) == []
    assert record_lines() == [(WRITTEN, 0, 1), (WRITTEN, 1, 1)]
    # WHEN a batch mixes a re-sent rank 0 (a new message: SQS's dedup window is over), an older
    # attempt's rank 1 (a late spool) and a new rank 2
    mixed = [body(rank=0, run_attempt=1), body(rank=1, run_attempt=0), body(rank=2, run_attempt=1)]
    assert invoke(make_event(mixed)) == []
    # THEN only the row that changed is "written"
    assert record_lines() == [(UNCHANGED, 0, 1), (UNCHANGED, 1, 0), (WRITTEN, 2, 1)]
    # AND a batch where nothing changes at all: the same message delivered again (its first
    # batch committed, its delete did not) says so too
    again = make_event([body(rank=3, run_attempt=1)])
    assert invoke(again) == []
    assert invoke(again) == []
    assert record_lines() == [(WRITTEN, 3, 1), (UNCHANGED, 3, 1)]
