"""``ckpt-pipeline status``: checkpoints, lag and queue depths per job.

What it shows is what it can reach: while the database is down the queue and DLQ depths and
the breaker's state (the writer's event source mapping) are still shown, and the database's
error is one line on stderr, as a queue's is.

Exit status: 0 when everything asked for was shown; 1 when a part could not be read (the rest is
still shown, each error one line on stderr naming its setting) or ``--job`` names a job with no
checkpoints; 2 when an option or setting is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ckpt_pipeline.cli_args import check_job
from ckpt_pipeline.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from ckpt_pipeline.ops.restarts_command import describe_restart, summary
from ckpt_pipeline.settings import DLQ_URL_VAR, MAPPING_VAR, QUEUE_URL_VAR, Settings


def add_parser(commands: Any) -> None:
    """Register ``status`` on the CLI's subcommands."""
    status = commands.add_parser("status", help="checkpoints, lag and queue depths per job")
    status.add_argument("--job", help="only this job (exit 1 when it has no checkpoints)")
    status.add_argument("--queue-url", help=f"main queue (default ${QUEUE_URL_VAR})")
    status.add_argument("--dlq-url", help=f"dead-letter queue (default ${DLQ_URL_VAR})")
    status.add_argument(
        "--mapping-uuid",
        help=f"the writer's event source mapping: the breaker's state (default ${MAPPING_VAR})",
    )
    status.add_argument("--json", action="store_true", help="JSON instead of a table")


def _restarts(url: str, job: str) -> dict[str, Any] | None:
    """The job's restart records and their cost, or None where the database has none to read
    (a schema before migration 0017: status still shows the rest)."""
    import psycopg

    from ckpt_pipeline.ops.restarts_command import gather_restarts

    try:
        return gather_restarts(url, job)
    except psycopg.errors.UndefinedTable:
        return None


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Show the table (or JSON); the queues' errors after it, one line each."""
    job = None if args.job is None else check_job(args.job)
    url = settings.require_database_url()
    from rich.console import Console

    from ckpt_pipeline.ops.sqs import lambda_client, sqs_client
    from ckpt_pipeline.ops.status import gather_status, render_json, render_table

    queue_url = args.queue_url or settings.queue_url
    dlq_url = args.dlq_url or settings.dlq_url
    mapping_uuid = args.mapping_uuid or settings.mapping_uuid
    report = gather_status(
        url,
        sqs=sqs_client() if queue_url or dlq_url else None,
        queue_url=queue_url,
        dlq_url=dlq_url,
        job=job,
        lambda_client=lambda_client() if mapping_uuid else None,
        mapping_uuid=mapping_uuid,
    )
    # One job: its restarts too (the restart records, `ckpt-pipeline restarts`).
    restarts = _restarts(url, job) if job is not None and report.jobs else None
    if args.json:
        document = json.loads(render_json(report))
        if restarts is not None:
            document["restarts"] = restarts
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        render_table(report, Console(), job=job)
        if restarts is not None and restarts["restarts"]:
            print("restarts:")
            for restart in restarts["restarts"]:
                print(f"  {describe_restart(restart)}")
            print(f"  {summary(restarts)}")
    for line in report.errors:
        print(f"ckpt-pipeline status: {line}", file=sys.stderr)
    missing = job is not None and report.jobs is not None and not report.jobs
    return EXIT_INCOMPLETE if report.errors or missing else EXIT_OK
