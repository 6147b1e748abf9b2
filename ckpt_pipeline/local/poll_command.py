"""``ckpt-pipeline poll``: the real writer driven from a queue as Lambda's SQS event source does.

The writer reads its settings from the environment as in Lambda (``WriterSettings.from_env``).
Where ``DLQ_URL`` is not set, poll takes the DLQ from the queue's own redrive policy (the stack
gives the deployed writer the same queue's URL) and says so once; a queue without one is refused,
since poison would then be retried, and logged, on every receive until its retention ends.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from ckpt_pipeline.cli_args import non_negative_float, positive_int
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.exit_codes import EXIT_FAILED, EXIT_OK
from ckpt_pipeline.settings import DLQ_URL_VAR, QUEUE_URL_VAR, Settings, require

if TYPE_CHECKING:
    from ckpt_pipeline.local.event_source import EventSourceStats
    from lambda_writer import BatchResult


# What `poll --help` lists: poll reads the writer's settings from the environment, as Lambda does.
_POLL_ENVIRONMENT = f"""environment:
  DATABASE_URL      the writer's database: postgresql://user@host:5432/dbname
                    (or, as deployed: DB_HOST, DB_PORT, DB_NAME, DB_USER,
                    DB_AUTH=iam|secret, DB_SECRET_ARN, DB_SSL_ROOT_CERT)
  {DLQ_URL_VAR:<17} the FIFO DLQ the writer sends poison to (default: the
                    queue's redrive target)
  {QUEUE_URL_VAR:<17} the queue to poll when --queue-url is not given
  AWS_ENDPOINT_URL  a local SQS (moto, LocalStack); AWS_REGION and
                    credentials as boto3 reads them
"""


def add_parser(commands: Any) -> None:
    """Register ``poll`` on the CLI's subcommands."""
    poll = commands.add_parser(
        "poll",
        help="drive the writer from a queue like Lambda does",
        description="Receive from the queue and invoke the real writer, as Lambda's SQS\n"
        "event source does. It checks the database (connect, schema version) before\n"
        "it receives anything.",
        epilog=_POLL_ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    poll.add_argument("--queue-url", help=f"queue to poll (default ${QUEUE_URL_VAR})")
    poll.add_argument(
        "--concurrency", type=int, choices=(1, 2), default=1, help="writer invocations at once"
    )
    poll.add_argument("--batch-size", type=int, default=10, help="records per invocation (≤ 10)")
    poll.add_argument("--wait-time", type=int, default=2, help="long-poll seconds (≤ 20)")
    poll.add_argument(
        "--visibility-timeout", type=positive_int, help="seconds (default: the queue's)"
    )
    poll.add_argument(
        "--lambda-timeout", type=float, default=30.0, help="the invocation's deadline in seconds"
    )
    poll.add_argument("--once", action="store_true", help="exit once the queue stays empty")
    poll.add_argument(
        "--idle-seconds",
        type=non_negative_float,
        default=2.0,
        help="with --once: how long the queue must stay empty (default 2)",
    )


def redrive_target(sqs: Any, queue_url: str) -> str | None:
    """The URL of the queue's DLQ from its RedrivePolicy, or None when it has none."""
    import json

    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])
    policy = attributes.get("Attributes", {}).get("RedrivePolicy")
    if not policy:
        return None
    arn = str(json.loads(policy)["deadLetterTargetArn"])
    # arn:aws:sqs:REGION:ACCOUNT:NAME
    _, _, _, _, account, name = arn.split(":", 5)
    return str(sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"])


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Drive the real writer from a queue; stop receiving while the database is unreachable."""
    from ckpt_pipeline.local.receive_gate import HealthGate
    from ckpt_pipeline.ops.db_check import check_writer_database
    from ckpt_pipeline.ops.sqs import sqs_client
    from ckpt_pipeline.sdk_errors import SQS, calling
    from lambda_writer import SettingsError, WriterSettings, check_database

    queue_url = require(
        args.queue_url or settings.queue_url, option="--queue-url", variable=QUEUE_URL_VAR
    )
    try:
        # Fail here, before anything is received.
        writer_settings = WriterSettings.from_env(settings.environ)
    except SettingsError as exc:
        raise ConfigError(exc.name, exc.rule) from None
    if settings.database_url:
        settings.require_database_url()
    # Before anything is received: a wrong setting must not burn receive counts into the DLQ.
    check_writer_database(writer_settings)
    sqs = sqs_client()
    if not writer_settings.dlq_url:
        with calling(SQS, f"--queue-url {queue_url}"):
            dlq_url = redrive_target(sqs, queue_url)
        if dlq_url is None:
            raise ConfigError(
                DLQ_URL_VAR,
                "is not set and the queue has no redrive policy to take the DLQ from;"
                " set it to the queue's FIFO DLQ",
            )
        if not args.quiet:
            print(
                f"ckpt-pipeline poll: {DLQ_URL_VAR} not set: poison goes to the queue's"
                f" redrive target {dlq_url}",
                file=sys.stderr,
            )
        writer_settings = dataclasses.replace(writer_settings, dlq_url=dlq_url)
    gate = HealthGate(lambda: check_database(writer_settings))
    stats, tally = _drive(args, sqs, queue_url, writer_settings, gate)
    print(_summary(sqs, queue_url, writer_settings.dlq_url, stats, tally, gate.trips))
    failed = stats.failed_records or stats.failed_batches or tally.poison_sent
    return EXIT_FAILED if args.once and failed else EXIT_OK


def _drive(
    args: argparse.Namespace, sqs: Any, queue_url: str, writer_settings: Any, gate: Any
) -> tuple[EventSourceStats, PollTally]:
    from ckpt_pipeline.local.event_source import LocalEventSource
    from ckpt_pipeline.ops.sqs import queue_arn_of
    from lambda_writer import make_handler

    tally = PollTally()
    source = LocalEventSource(
        sqs,
        queue_url=queue_url,
        queue_arn=queue_arn_of(sqs, queue_url),
        # One execution environment of the real writer per worker, as Lambda runs them; the
        # writer's JSON lines at ERROR only with --quiet.
        handler_factory=lambda: make_handler(
            writer_settings,
            emit_metrics=False,
            log_level="ERROR" if args.quiet else None,
            on_done=tally.add,
        ),
        batch_size=args.batch_size,
        max_concurrency=args.concurrency,
        visibility_timeout_s=args.visibility_timeout,
        wait_time_s=args.wait_time,
        lambda_timeout_s=args.lambda_timeout,
        # The same check as the deployed circuit breaker (lambda_writer.breaker): after a batch
        # with failed records, an unreachable database stops receiving until a re-check passes.
        gate=gate,
    )
    if args.once:
        return source.drain(until_empty_for_s=args.idle_seconds, timeout=float("inf")), tally
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # only a flag: the workers finish their invocation and exit

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return source.run(stop), tally


def _summary(
    sqs: Any,
    queue_url: str,
    dlq_url: str | None,
    stats: EventSourceStats,
    tally: PollTally,
    trips: int,
) -> str:
    from ckpt_pipeline.ops.sqs import queue_depth

    where = f" in_queue={queue_depth(sqs, queue_url).total}"
    if dlq_url:
        where += f" in_dlq={queue_depth(sqs, dlq_url).total}"
    return (
        f"batches={stats.batches} records={stats.records} written={tally.written}"
        f" poison_to_dlq={tally.poison_sent} retried={stats.failed_records}"
        f" (transient={tally.transient} poison_unsent={tally.poison_unsent})"
        f" failed_batches={stats.failed_batches} breaker_trips={trips}"
        f" max_concurrent={stats.max_concurrent_invocations}{where}"
    )


class PollTally:
    """What poll's writers did, summed over its workers: written, poison, transient failures.

    The event source only sees the partial batch response, in which a poison record sent to the
    DLQ counts as done; the summary must count it apart, so each worker keeps the writer's own
    :class:`~lambda_writer.BatchResult`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.written = 0
        self.poison_sent = 0
        self.poison_unsent = 0
        self.transient = 0

    def add(self, result: BatchResult | None, cpu_s: float) -> None:
        """Count one invocation's result (the writer's ``on_done`` hook; None: it raised)."""
        if result is None:
            return
        with self._lock:
            self.written += result.written
            self.poison_sent += result.poison - result.poison_unsent
            self.poison_unsent += result.poison_unsent
            self.transient += result.transient_failures
