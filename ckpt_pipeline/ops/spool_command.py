"""``ckpt-pipeline spool send``: send what a job's spool still holds, with a summary.

A trainer whose queue was wrong or unreachable keeps its reports in ``<spool_dir>/<job_id>/
rank-<r>.spool`` (nothing is lost); the next start of the same job and rank sends them. This
sends them now, once the queue is right: one reporter per spool found, as that rank would open
it (its own flock keeps a live job's spool out), flushed and closed. Saved checkpoints whose
finishing an earlier process left undone (``rank-<r>.finishing/``: a killed upload, a bucket
that was missing) are finished and reported too, uploads included: the ``s3_upload`` post-step
is registered when a job asks for it, with the prefix the job recorded and boto3's standard
configuration (credentials, region, ``AWS_ENDPOINT_URL``).

Exit status: 0 when every spool is empty and every saved checkpoint finished afterwards, 1 when
some reports are left (each line says how many and the queue's error), a checkpoint is not
finished (one line each: its step and why, S3's error for an upload), or a spool is in use by a
live job.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpt_pipeline.cli_args import non_negative_float
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import QUEUE_URL_VAR, Settings, require

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


# The post-steps this command can run for a job that asks for them, built from what the job
# records (the upload's prefix is in the job's own parameters): the library's own ones only; a
# post-step of a user's own is not known here and its checkpoint is named as left.
_KNOWN_POST_STEPS = ("s3_upload",)
# How long a stopped finisher may take to let go of the job in hand (an upload between files).
_STOP_WAIT_S = 10.0


def post_steps_for(calls: Iterable[str]) -> list[Any]:
    """The post-steps to register for jobs asking for ``calls`` (names), those known here."""
    steps: list[Any] = []
    if "s3_upload" in calls:
        from trainer_client.storage.s3_finish import S3Upload

        steps.append(S3Upload())  # boto3's standard configuration, as the trainer's default
    return steps


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Send each spool's reports and finish its saved checkpoints; one line per spool, one per
    checkpoint left, and a summary."""
    from trainer_client import CheckpointReporter
    from trainer_client.exceptions import SpoolLocked
    from trainer_client.finish.finish_job import jobs_left

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
    sent = left = busy = finished = unfinished = 0
    for job_id, rank in spools:
        finishing = root / job_id / f"rank-{rank}.finishing"
        before = jobs_left(finishing)
        names = {call.name for job in before for call in job.post}
        try:
            reporter = CheckpointReporter(
                queue_url,
                job_id,
                root,
                rank=rank,
                world_size=rank + 1,
                spot_poll=False,
                install_signal_handler=False,
                post_steps=post_steps_for(names),
            )
        except SpoolLocked:
            busy += 1
            print(f"job {job_id} rank {rank}: in use by a running job (it sends its own)")
            continue
        # Counted by the sender, not as pending before minus after: its thread starts sending
        # the recovered reports as the reporter opens, so "before" may already be zero.
        # flush() waits for the recovered checkpoints to be finished (uploads included) first.
        reporter.flush(args.timeout)
        remaining, error = reporter.pending, reporter.last_error
        reporter.close(0)
        # close(0) stops the finisher without joining it: the job in hand is deferred at its
        # next check (a post-step's retry wait ends at once) and notes why; wait for that.
        _wait_until_finished(reporter, _STOP_WAIT_S)
        delivered = reporter.stats.sent
        after = jobs_left(finishing)
        sent += delivered
        left += remaining
        finished += max(0, len(before) - len(after))
        unfinished += len(after)
        why = f" ({type(error).__name__}: {error})" if remaining and error else ""
        done = f"; {len(before) - len(after)} of {len(before)} saved checkpoints finished"
        print(
            f"job {job_id} rank {rank}: {delivered} sent, {remaining} left{why}"
            + (done if before else "")
        )
        for job in after:
            print(
                f"job {job_id} rank {rank}: checkpoint of step {job.step} not finished: "
                + _why_left(job)
            )
    saved = f"; {finished} checkpoints finished, {unfinished} not finished"
    print(
        f"{len(spools)} spools under {root}: {sent} reports sent, {left} left, {busy} in use"
        + (saved if finished or unfinished else "")
    )
    return EXIT_LEFT if left or busy or unfinished else EXIT_OK


def _wait_until_finished(reporter: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while reporter.stats.finishing and time.monotonic() < deadline:
        time.sleep(0.05)


def _why_left(job: Any) -> str:
    unknown = sorted({c.name for c in job.post} - set(_KNOWN_POST_STEPS))
    if unknown:
        return (
            f"post-step {', '.join(map(repr, unknown))} is the trainer's own, unknown here: the"
            " next start of the job (with that post-step registered) finishes it"
        )
    return str(job.why or "not finished within --timeout")
