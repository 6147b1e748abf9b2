"""``ckpt-pipeline spool send``: send what a job's spool still holds, with a summary.

A trainer whose queue was wrong or unreachable keeps its reports in ``<spool_dir>/<job_id>/
rank-<r>.spool`` (nothing is lost); the next start of the same job and rank sends them. This
sends them now, once the queue is right: one reporter per spool found, as that rank would open
it (its own flock keeps a live job's spool out), flushed and closed. Saved checkpoints whose
finishing an earlier process left undone are finished and reported too.

Exit status: 0 when every spool is empty afterwards, 1 when some reports are left (each line
says how many and the queue's error) or a spool is in use by a live job.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from ckpt_pipeline.cli_args import non_negative_float
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.settings import QUEUE_URL_VAR, Settings, require

EXIT_OK = 0
EXIT_LEFT = 1
_SPOOL = re.compile(r"^rank-(\d+)\.spool$")


def add_parser(commands: Any) -> None:
    """Register ``spool send`` on the CLI's subcommands."""
    spool = commands.add_parser("spool", help="send what a trainer's spool still holds")
    actions = spool.add_subparsers(dest="spool_action", required=True, metavar="ACTION")
    send = actions.add_parser(
        "send",
        help="send every report left in the spools under --dir",
        description="Send the reports left in <dir>/<job_id>/rank-<r>.spool (the spool_dir a\n"
        "job used) to the queue, and say per spool what was sent and what is left.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("--dir", required=True, type=Path, help="the job's spool_dir")
    send.add_argument("--queue-url", help=f"the queue (default ${QUEUE_URL_VAR})")
    send.add_argument(
        "--timeout",
        type=non_negative_float,
        default=30.0,
        help="seconds to wait per spool for SQS to acknowledge (default 30)",
    )


def spools_under(root: Path) -> list[tuple[str, int]]:
    """(job id, rank) of every spool file under ``root``."""
    found = []
    for path in sorted(root.glob("*/rank-*.spool")):
        match = _SPOOL.match(path.name)
        if match:
            found.append((path.parent.name, int(match.group(1))))
    return found


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Send each spool's reports; one line per spool and a summary."""
    from trainer_client import CheckpointReporter
    from trainer_client.exceptions import SpoolLocked

    queue_url = require(
        args.queue_url or settings.queue_url, option="--queue-url", variable=QUEUE_URL_VAR
    )
    root: Path = args.dir
    if not root.is_dir():
        raise ConfigError("--dir", f"{root} is not a directory")
    spools = spools_under(root)
    if not spools:
        raise ConfigError(
            "--dir", f"no spool under {root} (expected <dir>/<job_id>/rank-<r>.spool)"
        )
    sent = left = busy = 0
    for job_id, rank in spools:
        try:
            reporter = CheckpointReporter(
                queue_url,
                job_id,
                root,
                rank=rank,
                world_size=rank + 1,
                spot_poll=False,
                install_signal_handler=False,
            )
        except SpoolLocked:
            busy += 1
            print(f"job {job_id} rank {rank}: in use by a running job (it sends its own)")
            continue
        # Counted by the sender, not as pending before minus after: its thread starts sending
        # the recovered reports as the reporter opens, so "before" may already be zero.
        reporter.flush(args.timeout)
        remaining, error = reporter.pending, reporter.last_error
        reporter.close(0)
        delivered = reporter.stats.sent
        sent += delivered
        left += remaining
        why = f" ({type(error).__name__}: {error})" if remaining and error else ""
        print(f"job {job_id} rank {rank}: {delivered} sent, {remaining} left{why}")
    print(f"{len(spools)} spools under {root}: {sent} reports sent, {left} left, {busy} in use")
    return EXIT_LEFT if left or busy else EXIT_OK
