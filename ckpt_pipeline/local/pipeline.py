"""The whole pipeline on one machine: a local SQS emulator (moto, or LocalStack with
``sqs="localstack"``), the queues, a migrated database, and the real writer driven by the local
event source. One harness for the demo, the benchmarks and the end-to-end tests, so all of them
exercise the same wiring.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ckpt_contract import deployment as constants
from ckpt_pipeline.local.event_source import LocalEventSource
from ckpt_pipeline.local.sqs_server import (
    PipelineQueues,
    SqsKind,
    create_pipeline_queues,
    environ_set,
    local_aws_env,
    sqs_emulator,
)
from ckpt_pipeline.local.writer_env import writer_handler_factory
from ckpt_pipeline.ops.sqs import queue_depth, sqs_client
from lambda_writer.connection import connect_url
from lambda_writer.migrate import apply_migrations

# How the writer's connections are told apart in pg_stat_activity.
WRITER_APPLICATION_NAME = "ckpt-writer"
# Locally a failed record should come back in seconds, not AWS's 6 x 30 s; the 6x ratio of
# visibility timeout to function timeout is kept.
LOCAL_LAMBDA_TIMEOUT_S = 2
LOCAL_VISIBILITY_TIMEOUT_S = 6 * LOCAL_LAMBDA_TIMEOUT_S


# Called with each invocation's event and its start (time.time()) before the writer runs: how a
# benchmark sees when each record reached the writer, beside what SQS says of it.
InvokeObserver = Callable[[dict[str, Any], float], None]


class HandlerCpu:
    """CPU seconds spent inside the writer's handler (its own thread's CPU per invocation), so a
    benchmark can tell the writer's share of this process from the event source's."""

    def __init__(self, observer: InvokeObserver | None = None) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._observer = observer

    def wrap(self, handler: Any) -> Any:
        def timed(event: Any, context: Any) -> Any:
            if self._observer is not None:
                self._observer(event, time.time())
            started = time.thread_time()
            try:
                return handler(event, context)
            finally:
                with self._lock:
                    self.seconds += time.thread_time() - started

        return timed


@dataclass(frozen=True)
class LocalPipeline:
    """A running local pipeline."""

    endpoint_url: str
    sqs: Any
    queues: PipelineQueues
    database_url: str
    writer_database_url: str
    source: LocalEventSource
    writer_cpu: HandlerCpu = field(default_factory=HandlerCpu)

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
    observer: InvokeObserver | None = None,
) -> Iterator[LocalPipeline]:
    """Start the ``sqs`` emulator (unless ``endpoint_url`` is given), create fresh queues,
    migrate, run the writer.

    The writer reads ``DATABASE_URL`` / ``DLQ_URL`` from the environment like the Lambda does;
    they are set for the duration of the block and restored afterwards. ``writer_database_url``
    lets the writer log in as another role (e.g. one capped like the seed's RDS user).
    ``observer`` sees every invocation's event as it starts (benchmarks' timelines).
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
        stack.enter_context(
            environ_set(
                {
                    "DATABASE_URL": writer_url,
                    "DLQ_URL": queues.dlq_url,
                    # EMF and JSON logs belong in CloudWatch; locally they would flood stdout.
                    "POWERTOOLS_METRICS_DISABLED": "true",
                    "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
                }
            )
        )
        # Imported once the environment is set: Powertools reads its log level at import.
        from lambda_writer.handler import get_writer

        # The handler caches its writer per process (one Lambda environment); a new pipeline in
        # the same process must not inherit the previous one's settings.
        get_writer.cache_clear()
        stack.callback(get_writer.cache_clear)
        handler, factory = writer_handler_factory(concurrency)
        cpu = HandlerCpu(observer)
        source = LocalEventSource(
            client,
            queue_url=queues.queue_url,
            queue_arn=queues.queue_arn,
            handler=None if handler is None else cpu.wrap(handler),
            handler_factory=None if factory is None else (lambda: cpu.wrap(factory())),
            max_concurrency=concurrency,
            lambda_timeout_s=lambda_timeout_s,
            wait_time_s=1,
        )
        if start:
            stack.enter_context(source)
        yield LocalPipeline(endpoint_url, client, queues, database_url, writer_url, source, cpu)
