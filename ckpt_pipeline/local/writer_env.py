"""The real writer as the local event source's handler: one shared, or one per worker.

``lambda_writer.handler.handler`` keeps one writer (one database connection) per process, which is
one Lambda execution environment. Two concurrent invocations in Lambda run in two environments;
two worker threads here would share that one connection, so for ``max_concurrency=2`` each worker
gets its own writer, built from the same settings the handler reads.
"""

from __future__ import annotations

from typing import Any

from ckpt_pipeline.local.event_source import Handler, HandlerFactory


def lambda_handler() -> Handler:
    """``lambda_writer.handler.handler`` itself (imported on first use)."""
    from lambda_writer.handler import handler

    return handler


def writer_environment() -> Handler:
    """A handler with its own writer and connection: one Lambda execution environment."""
    from lambda_writer.records import parse_event
    from lambda_writer.settings import WriterSettings
    from lambda_writer.writer import CheckpointWriter

    writer = CheckpointWriter(WriterSettings.from_env())

    def handler(event: dict[str, Any], context: Any) -> dict[str, list[dict[str, str]]]:
        return writer.process(parse_event(event)).batch_response()

    return handler


def writer_handler_factory(max_concurrency: int) -> tuple[Handler | None, HandlerFactory | None]:
    """``(handler, handler_factory)`` for ``LocalEventSource``: the real handler when one worker
    suffices, else one writer environment per worker."""
    if max_concurrency == 1:
        return lambda_handler(), None
    return None, writer_environment
