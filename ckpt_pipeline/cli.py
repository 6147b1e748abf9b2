"""ckpt-pipeline: run the checkpoint pipeline locally, migrate, inspect, replay the DLQ.

Environment: DATABASE_URL (migrate, status, poll), CKPT_QUEUE_URL and DLQ_URL (defaults for the
queue options); boto3's usual configuration (AWS_REGION, AWS_ENDPOINT_URL, credentials) for SQS.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from ckpt_contract.exceptions import PolicyError
from ckpt_pipeline.cli_help import add_examples
from ckpt_pipeline.exceptions import ConfigError, PipelineError
from ckpt_pipeline.settings import (
    DLQ_URL_VAR,
    QUEUE_URL_VAR,
    Settings,
    check_database_url,
    require,
)

if TYPE_CHECKING:
    from lambda_writer import BatchResult

logger = logging.getLogger("ckpt_pipeline")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


# What `poll --help` lists: poll reads the writer's settings from the environment, as Lambda does.
_POLL_ENVIRONMENT = f"""environment:
  DATABASE_URL      the writer's database: postgresql://user@host:5432/dbname
                    (or, as deployed: DB_HOST, DB_PORT, DB_NAME, DB_USER,
                    DB_AUTH=iam|secret, DB_SECRET_ARN, DB_SSL_ROOT_CERT)
  DLQ_URL           the FIFO DLQ the writer sends poison to
  {QUEUE_URL_VAR:<17} the queue to poll when --queue-url is not given
  AWS_ENDPOINT_URL  a local SQS (moto, LocalStack); AWS_REGION and
                    credentials as boto3 reads them
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ckpt-pipeline", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="errors only")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="the local end-to-end run (torch ranks, preemption)")
    demo.add_argument("--ranks", type=_positive_int, default=8, help="torch ranks (default 8)")
    demo.add_argument("--epochs", type=_positive_int, default=5, help="epochs (default 5)")
    demo.add_argument(
        "--no-preemption", dest="preemption", action="store_false", help="no simulated preemption"
    )
    demo.add_argument("--compare", action="store_true", help="the direct-write baseline beside")
    demo.add_argument(
        "--compare-ranks",
        type=_positive_int,
        default=32,
        help="ranks in --compare (x pool 5 must exceed the 30-connection cap)",
    )

    commands.add_parser("migrate", help="apply pending schema migrations to DATABASE_URL")

    status = commands.add_parser("status", help="checkpoints, lag and queue depths per job")
    status.add_argument("--job", help="only this job")
    status.add_argument("--queue-url", help=f"main queue (default ${QUEUE_URL_VAR})")
    status.add_argument("--dlq-url", help=f"dead-letter queue (default ${DLQ_URL_VAR})")
    status.add_argument("--json", action="store_true", help="JSON instead of a table")

    replay = commands.add_parser("replay-dlq", help="list or re-drive DLQ messages")
    replay.add_argument("--dlq-url", help=f"dead-letter queue (default ${DLQ_URL_VAR})")
    replay.add_argument("--queue-url", help=f"queue to re-drive to (default ${QUEUE_URL_VAR})")
    replay.add_argument("--dry-run", action="store_true", help="list only, move nothing")
    replay.add_argument("--job", help="only messages whose body has this job_id")
    replay.add_argument("--reason", help="regex (or substring) of ErrorClass: ErrorMessage")
    replay.add_argument("--limit", type=_positive_int, help="move at most this many")
    replay.add_argument(
        "--visibility-timeout",
        type=_positive_int,
        default=60,
        help="seconds a received DLQ message stays hidden (default 60)",
    )

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
        "--visibility-timeout", type=_positive_int, help="seconds (default: the queue's)"
    )
    poll.add_argument(
        "--lambda-timeout", type=float, default=30.0, help="the invocation's deadline in seconds"
    )
    poll.add_argument("--once", action="store_true", help="exit once the queue stays empty")
    poll.add_argument(
        "--idle-seconds",
        type=_non_negative_float,
        default=2.0,
        help="with --once: how long the queue must stay empty (default 2)",
    )
    preflight = commands.add_parser(
        "preflight", help="would cdk deploy fail here? Lambda concurrency, quotas, Region"
    )
    preflight.add_argument("--cdk-json", default="cdk.json", help="context file (default cdk.json)")
    preflight.add_argument(
        "-c", "--context", action="append", metavar="KEY=VALUE", help="context override, as cdk"
    )
    from ckpt_pipeline.ops import checkpoints_command, prune_command, reconcile_cli

    reconcile_cli.add_parser(commands)
    checkpoints_command.add_parser(commands)
    prune_command.add_parser(commands)
    for sub in commands.choices.values():
        # Also after the subcommand (`ckpt-pipeline poll -q`); SUPPRESS keeps a top-level -q.
        sub.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="errors only"
        )
    add_examples(parser, commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckpt-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if not quiet and verbose == 0:
        level = logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _sqs() -> Any:
    from ckpt_pipeline.ops.sqs import sqs_client

    return sqs_client()


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.demo.run import main_demo

    return main_demo(args)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from lambda_writer import MigrationError, apply_migrations, connect_url

    url = settings.require_database_url()
    check_database_url(url)
    try:
        with connect_url(url) as conn:
            applied = apply_migrations(conn)
    except MigrationError as exc:
        # Names the migration and what the role lacks (CREATE on public, CREATEROLE); nothing
        # of the run is applied (one transaction).
        print(f"ckpt-pipeline migrate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    url = settings.require_database_url()
    from rich.console import Console

    from ckpt_pipeline.ops.status import gather_status, render_json, render_table

    queue_url = args.queue_url or settings.queue_url
    dlq_url = args.dlq_url or settings.dlq_url
    report = gather_status(
        url,
        sqs=_sqs() if queue_url or dlq_url else None,
        queue_url=queue_url,
        dlq_url=dlq_url,
        job=args.job,
    )
    if args.json:
        print(render_json(report))
    else:
        render_table(report, Console())
    return EXIT_OK


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.ops.replay_view import run_replay

    dlq_url = require(args.dlq_url or settings.dlq_url, option="--dlq-url", variable=DLQ_URL_VAR)
    if not dlq_url.startswith(("https://", "http://")):
        raise ConfigError("--dlq-url", "must be an SQS queue URL (http[s]://…)")
    queue_url = args.queue_url or settings.queue_url
    if not args.dry_run:
        queue_url = require(queue_url, option="--queue-url", variable=QUEUE_URL_VAR)
    return run_replay(_sqs(), args, dlq_url=dlq_url, queue_url=queue_url)


def cmd_poll(args: argparse.Namespace, settings: Settings) -> int:
    """Drive the real writer from a queue; stop receiving while the database is unreachable."""
    from ckpt_pipeline.local.event_source import LocalEventSource
    from ckpt_pipeline.local.receive_gate import HealthGate
    from ckpt_pipeline.ops.sqs import queue_arn_of, queue_depth

    queue_url = require(
        args.queue_url or settings.queue_url, option="--queue-url", variable=QUEUE_URL_VAR
    )
    from lambda_writer import SettingsError, WriterSettings, check_database, make_handler

    try:
        # Fail here, before anything is received.
        writer_settings = WriterSettings.from_env(settings.environ)
    except SettingsError as exc:
        print(f"ckpt-pipeline poll: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if settings.database_url:
        check_database_url(settings.database_url)
    from ckpt_pipeline.ops.db_check import check_writer_database

    # Before anything is received: a wrong setting must not burn receive counts into the DLQ.
    check_writer_database(writer_settings)
    tally = _PollTally()
    # The same check as the deployed circuit breaker (lambda_writer.breaker): after a batch with
    # failed records, an unreachable database stops receiving until a re-check passes.
    gate = HealthGate(lambda: check_database(writer_settings))
    sqs = _sqs()
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
        gate=gate,
    )
    if args.once:
        stats = source.drain(until_empty_for_s=args.idle_seconds, timeout=float("inf"))
    else:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()  # only a flag: the workers finish their invocation and exit

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        stats = source.run(stop)
    where = f" in_queue={queue_depth(sqs, queue_url).total}"
    if writer_settings.dlq_url:
        where += f" in_dlq={queue_depth(sqs, writer_settings.dlq_url).total}"
    print(
        f"batches={stats.batches} records={stats.records} written={tally.written}"
        f" poison_to_dlq={tally.poison_sent} retried={stats.failed_records}"
        f" (transient={tally.transient} poison_unsent={tally.poison_unsent})"
        f" failed_batches={stats.failed_batches} breaker_trips={gate.trips}"
        f" max_concurrent={stats.max_concurrent_invocations}{where}"
    )
    failed = stats.failed_records or stats.failed_batches or tally.poison_sent
    return EXIT_FAILED if args.once and failed else EXIT_OK


class _PollTally:
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


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.ops import reconcile_cli

    return reconcile_cli.run(args, settings)


def cmd_preflight(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.ops.preflight_aws import main_preflight

    return main_preflight(args)


def cmd_checkpoints(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.ops.checkpoints_command import run

    return run(args, settings)


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    from ckpt_pipeline.ops.prune_command import run

    return run(args, settings)


_COMMANDS = {
    "demo": cmd_demo,
    "migrate": cmd_migrate,
    "status": cmd_status,
    "replay-dlq": cmd_replay,
    "poll": cmd_poll,
    "preflight": cmd_preflight,
    "reconcile": cmd_reconcile,
    "checkpoints": cmd_checkpoints,
    "prune": cmd_prune,
}


# Which distribution extra each command needs (pyproject.toml).
_EXTRAS = {
    "demo": "demo",
    "migrate": "ops",
    "status": "ops",
    "replay-dlq": "ops",
    "poll": "local",
    "reconcile": "ops",
    "checkpoints": "ops",
    "prune": "ops",
}


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one subcommand with ``env`` (default ``os.environ``); returns the exit code."""
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose, args.quiet)
    try:
        return _COMMANDS[args.command](args, Settings.from_env(env))
    except (ConfigError, PolicyError) as exc:
        # PolicyError: a retention option (the contract's rules, shared with the CDK context).
        print(f"ckpt-pipeline {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except PipelineError as exc:
        print(f"ckpt-pipeline {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        # Each command needs its role's extra; a base (trainer-only) install has none of them.
        extra = _EXTRAS.get(args.command, "ops")
        print(
            f"ckpt-pipeline {args.command}: needs the '{extra}' extra"
            f" (pip install 'ckpt-pipeline[{extra}]'): module {exc.name!r} is not installed",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except Exception as exc:
        # Configuration the SDKs reject (no region, no credentials) is still a one-line message.
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            NoRegionError,
        )

        if isinstance(exc, EndpointConnectionError):
            print(f"ckpt-pipeline {args.command}: SQS: {exc}", file=sys.stderr)
            return EXIT_FAILED
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            print(
                f"ckpt-pipeline {args.command}: SQS {error.get('Code', 'error')}:"
                f" {error.get('Message', '')}".rstrip(": "),
                file=sys.stderr,
            )
            return EXIT_FAILED

        if isinstance(exc, NoRegionError):
            print(f"ckpt-pipeline {args.command}: AWS_REGION: is not set", file=sys.stderr)
            return EXIT_CONFIG
        if isinstance(exc, NoCredentialsError):
            print(f"ckpt-pipeline {args.command}: AWS credentials: none found", file=sys.stderr)
            return EXIT_CONFIG
        import psycopg

        if isinstance(exc, psycopg.errors.UndefinedTable):
            print(
                f"ckpt-pipeline {args.command}: database is not migrated:"
                " run `ckpt-pipeline migrate`",
                file=sys.stderr,
            )
            return EXIT_FAILED
        if isinstance(exc, psycopg.OperationalError):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"ckpt-pipeline {args.command}: database: {first}", file=sys.stderr)
            return EXIT_FAILED
        raise


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
