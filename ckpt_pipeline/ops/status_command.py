"""``ckpt-pipeline status``: checkpoints, lag and queue depths per job.

Exit status: 0 when everything asked for was shown; 1 when a queue could not be read (the table
is still shown, the queue's error on stderr with its URL) or ``--job`` names a job with no
checkpoints; 2 when an option or setting is refused.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ckpt_pipeline.cli_args import check_job
from ckpt_pipeline.settings import DLQ_URL_VAR, QUEUE_URL_VAR, Settings

EXIT_OK = 0
EXIT_INCOMPLETE = 1


def add_parser(commands: Any) -> None:
    """Register ``status`` on the CLI's subcommands."""
    status = commands.add_parser("status", help="checkpoints, lag and queue depths per job")
    status.add_argument("--job", help="only this job (exit 1 when it has no checkpoints)")
    status.add_argument("--queue-url", help=f"main queue (default ${QUEUE_URL_VAR})")
    status.add_argument("--dlq-url", help=f"dead-letter queue (default ${DLQ_URL_VAR})")
    status.add_argument("--json", action="store_true", help="JSON instead of a table")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Show the table (or JSON); the queues' errors after it, one line each."""
    job = None if args.job is None else check_job(args.job)
    url = settings.require_database_url()
    from rich.console import Console

    from ckpt_pipeline.ops.sqs import sqs_client
    from ckpt_pipeline.ops.status import gather_status, render_json, render_table

    queue_url = args.queue_url or settings.queue_url
    dlq_url = args.dlq_url or settings.dlq_url
    report = gather_status(
        url,
        sqs=sqs_client() if queue_url or dlq_url else None,
        queue_url=queue_url,
        dlq_url=dlq_url,
        job=job,
    )
    if args.json:
        print(render_json(report))
    else:
        render_table(report, Console(), job=job)
    for line in report.queue_errors:
        print(f"ckpt-pipeline status: {line}", file=sys.stderr)
    missing = job is not None and not report.jobs
    return EXIT_INCOMPLETE if report.queue_errors or missing else EXIT_OK
