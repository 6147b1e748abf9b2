"""``ckpt-pipeline local``: the whole pipeline on this machine for your own training script.

It starts what the deployed stack provides, on the embedded defaults: moto's SQS (and S3) server
with the FIFO queue and its FIFO DLQ created by :func:`~ckpt_pipeline.local.sqs_server.
create_pipeline_queues` (the one place that creates them, configured as the CDK stack does), a
bucket when ``--bucket`` asks for one, a migrated database, and the real writer behind the local
event source (what ``poll`` runs). It prints the environment a training script and the other
commands need, writes it to ``--env-file`` if asked, and runs until Ctrl-C.

The database: ``DATABASE_URL`` if set; else database ``--dbname`` (``ckpt_local``) on the
machine's server (``CKPT_LOCAL_ADMIN_URL``, default postgres@127.0.0.1:5432), created when absent
and kept, so the rows outlive the command; else a throwaway cluster from the machine's PostgreSQL
binaries, dropped on exit (said when it starts).
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import DATABASE_URL_VAR, DLQ_URL_VAR, QUEUE_URL_VAR, Settings

if TYPE_CHECKING:
    from lambda_writer import BatchResult

DEFAULT_DBNAME = "ckpt_local"
READ_DATABASE_URL_VAR = "CKPT_READ_DATABASE_URL"
# What callback.resume(...) / resume(reporter) read on rank 0 (trainer_client.restart.resume).
RESUME_DATABASE_URL_VAR = "CKPT_RESUME_DATABASE_URL"


def add_parser(commands: Any) -> None:
    """Register ``local`` on the CLI's subcommands."""
    local = commands.add_parser(
        "local",
        help="the pipeline on this machine for your own script (until Ctrl-C)",
        description="Start the SQS emulator with the queue and DLQ as the stack creates them,\n"
        "a migrated database and the writer behind the local event source; print the\n"
        "environment your training script and the other commands need. Runs until Ctrl-C.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    local.add_argument("--bucket", help="also create this S3 bucket on the emulator")
    local.add_argument(
        "--env-file", type=Path, help="also write the export lines to this file (to `source`)"
    )
    local.add_argument(
        "--dbname",
        default=DEFAULT_DBNAME,
        help=f"the database on the local server (default {DEFAULT_DBNAME}; kept)",
    )
    local.add_argument(
        "--concurrency", type=int, choices=(1, 2), default=2, help="writer invocations at once"
    )


def environment(pipeline: Any) -> dict[str, str]:
    """What a training script and the other commands need to reach this pipeline."""
    env = dict(pipeline.client_env())
    env[DLQ_URL_VAR] = pipeline.queues.dlq_url
    env[DATABASE_URL_VAR] = pipeline.database_url
    env[READ_DATABASE_URL_VAR] = pipeline.database_url
    env[RESUME_DATABASE_URL_VAR] = pipeline.database_url
    order = (
        QUEUE_URL_VAR,
        DLQ_URL_VAR,
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        DATABASE_URL_VAR,
        READ_DATABASE_URL_VAR,
        RESUME_DATABASE_URL_VAR,
    )
    return {key: env[key] for key in order if key in env}


def export_lines(env: dict[str, str]) -> list[str]:
    """``export K=V`` lines a shell can source."""
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


@contextmanager
def _database(settings: Settings, dbname: str) -> Iterator[tuple[str, str]]:
    """The database URL and a line saying which one it is."""
    from psycopg import sql

    from ckpt_pipeline.local.embedded_pg import (
        server_reachable,
        start_throwaway_cluster,
    )

    if settings.database_url:
        yield settings.require_database_url(), f"{DATABASE_URL_VAR} (from the environment)"
        return
    admin = settings.local_admin_url
    if server_reachable(admin):
        import psycopg

        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,))
            if exists.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        yield (
            psycopg.conninfo.make_conninfo(admin, dbname=dbname),
            (f"{dbname} on the local server (kept after Ctrl-C)"),
        )
        return
    with start_throwaway_cluster() as cluster:
        yield (
            cluster.create_database(dbname),
            (
                f"{dbname} on a throwaway PostgreSQL cluster (no server at"
                f" {_where(admin)}): dropped on Ctrl-C with its rows"
            ),
        )


def _where(url: str) -> str:
    """host:port of a URL or DSN (never its password)."""
    import psycopg

    parts = psycopg.conninfo.conninfo_to_dict(url)
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}"


def _on_done(result: BatchResult | None, cpu_s: float) -> None:
    if result is None or not (result.written or result.poison or result.failed):
        return
    stamp = datetime.now().strftime("%H:%M:%S")
    parts = [f"{result.written} reports written"]
    if result.poison:
        parts.append(f"{result.poison} poison to the DLQ")
    if result.failed:
        parts.append(f"{len(result.failed)} to retry")
    print(f"{stamp} writer: {', '.join(parts)}", flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Bring the pipeline up, print the environment, serve until Ctrl-C."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", args.dbname):
        raise ConfigError("--dbname", "must be 1-63 chars of [a-z0-9_], not starting with a digit")
    if args.bucket is not None and not args.bucket.strip():
        raise ConfigError("--bucket", "must name a bucket")
    from ckpt_pipeline.local.pipeline import local_pipeline
    from ckpt_pipeline.sdk_errors import S3, calling

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with ExitStack() as stack:
        url, which = stack.enter_context(_database(settings, args.dbname))
        pipeline = stack.enter_context(
            local_pipeline(url, concurrency=args.concurrency, on_done=_on_done)
        )
        if args.bucket:
            import boto3

            s3 = boto3.client("s3", endpoint_url=pipeline.endpoint_url)
            with calling(S3, f"--bucket {args.bucket}"):
                s3.create_bucket(Bucket=args.bucket)
        lines = export_lines(environment(pipeline))
        if args.env_file is not None:
            args.env_file.write_text("".join(f"{line}\n" for line in lines))
            # Gone with the emulator: a stale file would point a script at a dead endpoint.
            stack.callback(args.env_file.unlink, missing_ok=True)
        print(f"queue {pipeline.queues.queue_url} and its DLQ on moto at {pipeline.endpoint_url}")
        if args.bucket:
            print(f"bucket s3://{args.bucket} on the same endpoint")
        print(f"database: {which}; migrated; the writer is running")
        where = f" (also in {args.env_file})" if args.env_file is not None else ""
        print(f"in the shell that runs your script{where}:")
        for line in lines:
            print(f"  {line}")
        print("Ctrl-C stops it.", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping: the writer finishes its batch", file=sys.stderr)
    print(f"stopped; {which}", file=sys.stderr)
    return EXIT_OK
