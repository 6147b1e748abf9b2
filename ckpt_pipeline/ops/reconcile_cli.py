"""The ``reconcile`` subcommand: its options and its run (the logic is in ``reconcile``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ckpt_pipeline.cli_args import check_job
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import QUEUE_URL_VAR, Settings, require

EXIT_FOUND = 1


def add_parser(commands: Any) -> None:
    """Register ``reconcile`` on the CLI's subcommands."""
    parser = commands.add_parser(
        "reconcile",
        help="checkpoints in the store without rows, rows whose objects differ",
        description="Compare a checkpoint store with the database for one job: checkpoints in\n"
        "the store with no row, rows whose objects are missing or not as reported. A dry\n"
        "run unless --backfill; never deletes. Checkpoints that prune removed (a tombstone)\n"
        "are listed as pruned, never backfilled. A rank whose objects are in the store with no\n"
        "row of its checkpoint's attempt is listed as partial; --backfill reports that rank\n"
        "only. Exit status 1 when something unreported, partial or differing was found; 2\n"
        "when the store holds none of the job's checkpoints while its rows point elsewhere\n"
        "(a mistyped --store).",
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
        "--run-attempt",
        type=int,
        default=0,
        help="run_attempt of an unreported checkpoint's backfilled reports (default 0)",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        help="world size of a checkpoint whose layout names none (a Lightning file, a plain"
        " directory); refused where the layout names another",
    )
    parser.add_argument(
        "--spread-prefixes",
        type=int,
        help="the upload's UploadSettings.spread_prefixes (16, 256, 4096, 65536; 0: none):"
        " every <hex>/prefix is listed too (default: as the job's rows' objects show)",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of lines")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Reconcile, print the findings and the summary line; backfill if asked."""
    from ckpt_pipeline.ops.reconcile import Store, reconcile
    from ckpt_pipeline.ops.reconcile_backfill import backfill_reports, send_reports
    from ckpt_pipeline.ops.reconcile_layout import compile_pattern
    from trainer_client.storage.uri import check_spread

    check_job(args.job)
    if args.min_age < 0:
        raise ConfigError("--min-age", "must be 0 or more")
    if args.run_attempt < 0:
        raise ConfigError("--run-attempt", "must be 0 or more")
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError("--world-size", "must be 1 or more")
    store = Store.parse(args.store)
    if args.spread_prefixes is not None:
        try:
            check_spread(args.spread_prefixes, "--spread-prefixes")
        except ValueError as exc:
            raise ConfigError("--spread-prefixes", str(exc).partition(": ")[2]) from None
    pattern = None
    if args.pattern is not None:
        try:
            pattern = compile_pattern(args.pattern)
        except ValueError as exc:
            raise ConfigError("--pattern", str(exc)) from None
    url = settings.require_database_url()
    queue_url = None
    if args.backfill:
        queue_url = require(
            args.queue_url or settings.queue_url, option="--queue-url", variable=QUEUE_URL_VAR
        )
    s3 = None
    if store.scheme == "s3":
        from trainer_client.storage.verify import VERIFY_MAX_WORKERS, s3_client_for

        s3 = s3_client_for(VERIFY_MAX_WORKERS)
    result, backfills = reconcile(
        job_id=args.job,
        store=store,
        database_url=url,
        s3=s3,
        pattern=pattern,
        min_age_s=args.min_age,
        world_size=args.world_size,
        spread_prefixes=args.spread_prefixes,
    )
    if result.in_store == 0 and result.rows_elsewhere:
        raise ConfigError(
            "--store",
            f"no checkpoints under {store.uri}, while the job's {result.rows_elsewhere} rows"
            f" point elsewhere (e.g. {result.elsewhere_example}): check the bucket and prefix",
        )
    if queue_url is not None:
        from ckpt_pipeline.ops.jobs import job_owner
        from ckpt_pipeline.ops.sqs import sqs_client
        from ckpt_pipeline.sdk_errors import S3, SQS, calling
        from lambda_writer import connect_url

        with connect_url(url, autocommit=True) as conn:
            owner = job_owner(conn, args.job)
        sqs = sqs_client()
        result.dry_run = False
        for backfill in backfills:
            with calling(S3, f"--store {store.uri}"):
                reports = backfill_reports(
                    args.job, backfill, store=store, s3=s3, run_attempt=args.run_attempt
                )
            with calling(SQS, f"--queue-url {queue_url}"):
                result.backfilled += send_reports(sqs, queue_url, reports, owner=owner)
    if args.json:
        print(result.as_json())
    else:
        for f in result.findings:
            layout = f" [{f.layout}]" if f.layout else ""
            todo = f" ({f.reports} reports)" if f.kind in ("unreported", "partial") else ""
            print(f"{f.kind:<11} step {f.step:<8} {f.where}{layout}: {f.detail}{todo}")
        print(result.summary(), file=sys.stdout)
    found = result.count("unreported") + result.count("partial") + result.count("differs")
    return EXIT_FOUND if found else EXIT_OK
