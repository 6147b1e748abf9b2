"""The ``reconcile`` subcommand: its options and its run (the logic is in ``reconcile``)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.settings import QUEUE_URL_VAR, Settings, check_database_url, require

EXIT_OK = 0
EXIT_FOUND = 1
_JOB_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def add_parser(commands: Any) -> None:
    """Register ``reconcile`` on the CLI's subcommands."""
    parser = commands.add_parser(
        "reconcile",
        help="checkpoints in the store without rows, rows whose objects differ",
        description="Compare a checkpoint store with the database for one job: checkpoints in\n"
        "the store with no row, rows whose objects are missing or not as reported. A dry\n"
        "run unless --backfill; never deletes. Exit status 1 when something was found.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--job", required=True, help="the job id")
    parser.add_argument("--store", required=True, help="s3://bucket/prefix or file:///dir")
    parser.add_argument(
        "--backfill",
        action="store_true",
        help="report unreported checkpoints through the queue (marked backfilled)",
    )
    parser.add_argument("--queue-url", help=f"queue for --backfill (default ${QUEUE_URL_VAR})")
    parser.add_argument(
        "--pattern",
        help="regex with a named group (?P<step>…) (and optionally (?P<rank>…)) for other layouts",
    )
    parser.add_argument(
        "--min-age",
        type=float,
        default=900.0,
        help="seconds since an unreported checkpoint's last write before it counts (default 900)",
    )
    parser.add_argument(
        "--run-attempt", type=int, default=0, help="run_attempt of backfilled reports (default 0)"
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of lines")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Reconcile, print the findings and the summary line; backfill if asked."""
    from ckpt_pipeline.ops.reconcile import Store, reconcile
    from ckpt_pipeline.ops.reconcile_backfill import backfill_reports, send_reports
    from ckpt_pipeline.ops.reconcile_layout import compile_pattern

    if not _JOB_ID.match(args.job):
        raise ConfigError("--job", "must be 1-128 chars of [A-Za-z0-9._:-]")
    if args.min_age < 0:
        raise ConfigError("--min-age", "must be 0 or more")
    if args.run_attempt < 0:
        raise ConfigError("--run-attempt", "must be 0 or more")
    store = Store.parse(args.store)
    pattern = None
    if args.pattern is not None:
        try:
            pattern = compile_pattern(args.pattern)
        except ValueError as exc:
            raise ConfigError("--pattern", str(exc)) from None
    url = settings.require_database_url()
    check_database_url(url)
    queue_url = None
    if args.backfill:
        queue_url = require(
            args.queue_url or settings.queue_url, option="--queue-url", variable=QUEUE_URL_VAR
        )
    s3 = None
    if store.scheme == "s3":
        from trainer_client.integrations.verify import DEFAULT_MAX_WORKERS, s3_client_for

        s3 = s3_client_for(DEFAULT_MAX_WORKERS)
    result, unreported = reconcile(
        job_id=args.job,
        store=store,
        database_url=url,
        s3=s3,
        pattern=pattern,
        min_age_s=args.min_age,
    )
    if queue_url is not None:
        from ckpt_pipeline.ops.sqs import sqs_client

        sqs = sqs_client()
        result.dry_run = False
        for checkpoint in unreported:
            reports = backfill_reports(
                args.job, checkpoint, store=store, s3=s3, run_attempt=args.run_attempt
            )
            result.backfilled += send_reports(sqs, queue_url, reports)
    if args.json:
        print(result.as_json())
    else:
        for f in result.findings:
            layout = f" [{f.layout}]" if f.layout else ""
            todo = f" ({f.reports} reports)" if f.kind == "unreported" else ""
            print(f"{f.kind:<11} step {f.step:<8} {f.where}{layout}: {f.detail}{todo}")
        print(result.summary(), file=sys.stdout)
    found = result.count("unreported") + result.count("differs")
    return EXIT_FOUND if found else EXIT_OK
