"""``ckpt-pipeline jobs``: every job with its owner; ``jobs transfer`` and ``jobs release``.

The owner is the principal the writer bound the job to (``ckpt_pipeline.ops.jobs``); a change
is recorded in ``ckpt_job_owner_changes`` with the operator's database user and the reason.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import Settings
from lambda_writer import check_job_id


def add_parser(commands: Any) -> None:
    """Register ``jobs`` (and its ``transfer``/``release`` actions) on the CLI's subparsers."""
    jobs = commands.add_parser("jobs", help="every job with its owner; transfer or release one")
    jobs.add_argument("--prefix", help="only jobs whose id starts with this")
    jobs.add_argument("--json", action="store_true", help="JSON instead of a table")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION")
    transfer = actions.add_parser("transfer", help="give a job to another principal (audited)")
    transfer.add_argument("job", help="the job")
    transfer.add_argument("--to", required=True, help="the new owner's role or user id (AROA…)")
    transfer.add_argument("--reason", required=True, help="why (recorded with the change)")
    release = actions.add_parser(
        "release", help="remove a job's owner: its next report's sender claims it (audited)"
    )
    release.add_argument("job", help="the job")
    release.add_argument("--reason", required=True, help="why (recorded with the change)")


def render_jobs(jobs: list[dict[str, Any]]) -> str:
    """The jobs as a table: id, owner, checkpoints, newest complete step, claimed."""
    lines = [f"{'job':<32} {'owner':<24} {'checkpoints':>11} {'newest':>10}  claimed"]
    for j in jobs:
        newest = "-" if j["newest_complete_step"] is None else str(j["newest_complete_step"])
        lines.append(
            f"{j['job_id']:<32} {j['owner'] or '(none)':<24} {j['checkpoints']:>11}"
            f" {newest:>10}  {j['claimed_at'] or '-'}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """List the jobs, or change one job's owner."""
    from ckpt_pipeline.ops import jobs
    from lambda_writer import connect_url

    url = settings.require_database_url()
    if args.action is None:
        with connect_url(url, autocommit=True) as conn:
            listed = jobs.list_jobs(conn, prefix=args.prefix)
        docs = [
            {
                "job_id": j.job_id,
                "owner": j.owner,
                "first_sender": j.first_sender,
                "claimed_at": None if j.claimed_at is None else j.claimed_at.isoformat(),
                "checkpoints": j.checkpoints,
                "newest_complete_step": j.newest_complete_step,
            }
            for j in listed
        ]
        print(json.dumps(docs, indent=2) if args.json else render_jobs(docs))
        return EXIT_OK
    job_id = check_job_id(args.job)
    reason = jobs.check_reason(args.reason)
    with connect_url(url, autocommit=True) as conn:
        if args.action == "transfer":
            change = jobs.transfer(conn, job_id, jobs.check_principal(args.to), reason=reason)
        else:
            change = jobs.release(conn, job_id, reason=reason)
    print(
        f"job {change.job_id}: {change.action}, owner {change.old_owner or '(none)'}"
        f" -> {change.new_owner or '(none)'} (by {change.changed_by},"
        f" {change.changed_at.isoformat()})"
    )
    return EXIT_OK
