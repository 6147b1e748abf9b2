"""``ckpt-pipeline replay-dlq``: its options; the run is ``replay_view.run_replay``."""

from __future__ import annotations

import argparse
from typing import Any

from ckpt_pipeline.cli_args import positive_int
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.settings import DLQ_URL_VAR, QUEUE_URL_VAR, Settings, require


def add_parser(commands: Any) -> None:
    """Register ``replay-dlq`` on the CLI's subcommands."""
    replay = commands.add_parser("replay-dlq", help="list or re-drive DLQ messages")
    replay.add_argument("--dlq-url", help=f"dead-letter queue (default ${DLQ_URL_VAR})")
    replay.add_argument("--queue-url", help=f"queue to re-drive to (default ${QUEUE_URL_VAR})")
    replay.add_argument("--dry-run", action="store_true", help="list only, move nothing")
    replay.add_argument("--job", help="only messages whose body has this job_id")
    replay.add_argument("--reason", help="regex (or substring) of ErrorClass: ErrorMessage")
    replay.add_argument("--limit", type=positive_int, help="move at most this many")
    replay.add_argument(
        "--json", action="store_true", help="every message with its whole reason, as JSON"
    )
    replay.add_argument(
        "--discard",
        metavar="REASON",
        help="delete the selected messages instead of moving them, each recorded in the"
        " database with REASON first (needs DATABASE_URL)",
    )
    replay.add_argument(
        "--after-transfer",
        action="store_true",
        help="also re-send 'foreign sender' messages (after `jobs transfer` gave their sender"
        " the job); the writer judges them again",
    )
    replay.add_argument(
        "--visibility-timeout",
        type=positive_int,
        default=60,
        help="seconds a received DLQ message stays hidden (default 60)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Check the queue URLs, then replay (or list)."""
    from ckpt_pipeline.ops.replay_view import run_replay
    from ckpt_pipeline.ops.sqs import sqs_client
    from ckpt_pipeline.sdk_errors import SQS, calling

    dlq_url = require(args.dlq_url or settings.dlq_url, option="--dlq-url", variable=DLQ_URL_VAR)
    if not dlq_url.startswith(("https://", "http://")):
        raise ConfigError("--dlq-url", "must be an SQS queue URL (http[s]://…)")
    queue_url = args.queue_url or settings.queue_url
    discard = None
    if args.discard is not None:
        from ckpt_pipeline.ops.dlq_discard import DiscardRecorder, check_discard_reason

        discard = DiscardRecorder(
            settings.require_database_url(), check_discard_reason(args.discard)
        )
    elif not args.dry_run:
        queue_url = require(queue_url, option="--queue-url", variable=QUEUE_URL_VAR)
    # Sends to the main queue are answered per message by the replay itself; what fails here
    # is reading the DLQ.
    with calling(SQS, f"--dlq-url {dlq_url}"):
        return run_replay(sqs_client(), args, dlq_url=dlq_url, queue_url=queue_url, discard=discard)
