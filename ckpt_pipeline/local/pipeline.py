"""The whole pipeline on one machine: a local SQS emulator (moto, or LocalStack with
``sqs="localstack"``), the queues, a migrated database, and the real writer driven by the local
event source. One harness for the demo, the benchmarks and the end-to-end tests, so all of them
exercise the same wiring.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from ckpt_pipeline.local.event_source import LocalEventSource
from ckpt_pipeline.local.sqs_server import (
    PipelineQueues,
    SqsKind,
    create_pipeline_queues,
    environ_set,
    local_aws_env,
    sqs_emulator,
)
from ckpt_pipeline.ops.sqs import queue_depth, sqs_client
from lambda_writer import (
    DoneHook,
    InvokeHook,
    WriterHandler,
    WriterSettings,
    apply_migrations,
    connect_url,
    make_handler,
)
from lambda_writer.shared import constants

# How the writer's connections are told apart in pg_stat_activity.
WRITER_APPLICATION_NAME = "ckpt-writer"
# Locally a failed record should come back in seconds, not AWS's 6 x 30 s; the 6x ratio of
# visibility timeout to function timeout is kept.
LOCAL_LAMBDA_TIMEOUT_S = 2
LOCAL_VISIBILITY_TIMEOUT_S = 6 * LOCAL_LAMBDA_TIMEOUT_S


@dataclass(frozen=True)
class LocalPipeline:
    """A running local pipeline."""

    endpoint_url: str
    sqs: Any
    queues: PipelineQueues
    database_url: str
    writer_database_url: str
    source: LocalEventSource
    writer_settings: WriterSettings

    def depth(self) -> int:
        """Messages in the main queue (visible + in flight)."""
        return queue_depth(self.sqs, self.queues.queue_url).total

    def dlq_depth(self) -> int:
        """Messages in the DLQ."""
        return queue_depth(self.sqs, self.queues.dlq_url).total

    def client_env(self) -> dict[str, str]:
        """Environment for trainer processes: queue URL plus boto3's local endpoint settings."""
        keys = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID")
        env = {k: os.environ[k] for k in keys if k in os.environ}
        env["AWS_SECRET_ACCESS_KEY"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "testing")
        env["CKPT_QUEUE_URL"] = self.queues.queue_url
        return env


def with_application_name(url: str, name: str) -> str:
    """``url`` with ``application_name`` set (a startup parameter, so no session state)."""
    return psycopg.conninfo.make_conninfo(url, application_name=name)


@contextmanager
def local_pipeline(
    database_url: str,
    *,
    concurrency: int = 2,
    endpoint_url: str | None = None,
    sqs: SqsKind = "moto",
    writer_database_url: str | None = None,
    visibility_timeout_s: int = LOCAL_VISIBILITY_TIMEOUT_S,
    lambda_timeout_s: float = LOCAL_LAMBDA_TIMEOUT_S,
    max_receive_count: int = constants.MAX_RECEIVE_COUNT,
    start: bool = True,
    log_level: str = "WARNING",
    on_invoke: InvokeHook | None = None,
    on_done: DoneHook | None = None,
) -> Iterator[LocalPipeline]:
    """Start the ``sqs`` emulator (unless ``endpoint_url`` is given), create fresh queues,
    migrate, run the writer.

    Each event source worker is one execution environment of the real writer
    (:func:`lambda_writer.make_handler`), built from explicit settings: this database and the
    fresh DLQ. ``writer_database_url`` lets the writer log in as another role (e.g. one capped
    like the seed's RDS user). ``log_level`` is the writer's (its JSON lines belong in
    CloudWatch; locally they would flood stdout). ``on_invoke`` and ``on_done`` observe every
    invocation (benchmarks' timelines and the writer's CPU share).
    """
    with ExitStack() as stack:
        if endpoint_url is None:
            endpoint_url = stack.enter_context(sqs_emulator(sqs))
        # Restored when the block ends: a later user of this process (a test session's own moto
        # server, say) must not inherit an endpoint that is gone.
        stack.enter_context(environ_set(local_aws_env(endpoint_url)))
        client = sqs_client(endpoint_url)
        queues = create_pipeline_queues(
            client,
            prefix=f"local-{uuid.uuid4().hex[:8]}",
            visibility_timeout_s=visibility_timeout_s,
            max_receive_count=max_receive_count,
        )
        with connect_url(database_url) as conn:
            apply_migrations(conn)
        writer_url = with_application_name(
            writer_database_url or database_url, WRITER_APPLICATION_NAME
        )
        writer_settings = WriterSettings(
            database_url=writer_url,
            dlq_url=queues.dlq_url,
            aws_region=local_aws_env(endpoint_url)["AWS_REGION"],
        )
        environments: list[WriterHandler] = []
        environments_lock = threading.Lock()

        def environment() -> WriterHandler:
            # One per worker thread, as Lambda runs concurrent batches in separate environments.
            handler = make_handler(
                writer_settings,
                emit_metrics=False,
                log_level=log_level,
                on_invoke=on_invoke,
                on_done=on_done,
            )
            with environments_lock:
                environments.append(handler)
            return handler

        @stack.callback
        def close_environments() -> None:  # after the event source has stopped (LIFO)
            for handler in environments:
                handler.close()

        source = LocalEventSource(
            client,
            queue_url=queues.queue_url,
            queue_arn=queues.queue_arn,
            handler_factory=environment,
            max_concurrency=concurrency,
            lambda_timeout_s=lambda_timeout_s,
            wait_time_s=1,
        )
        if start:
            stack.enter_context(source)
        yield LocalPipeline(
            endpoint_url, client, queues, database_url, writer_url, source, writer_settings
        )
