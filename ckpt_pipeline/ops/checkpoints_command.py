"""``ckpt-pipeline checkpoints``: one job's checkpoints, its resume target and its best one.

The value column is ``ckpt_checkpoint_values`` (migration 0009): the mean of the metric over the
shards of each checkpoint's current attempt. The best checkpoint is the one
:func:`trainer_client.restart.best.best_complete_checkpoint` names (with its storage check),
so this command and the helper always agree.

Exit status: 0; 1 when ``--best`` finds no best checkpoint (the line says why); 2 when an option
is refused.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckpt_contract.message import MODES
from ckpt_pipeline.exceptions import ConfigError, PipelineError
from ckpt_pipeline.exit_codes import EXIT_OK
from ckpt_pipeline.settings import Settings
from lambda_writer import check_job_id, check_metric

EXIT_NO_BEST = 1


def add_parser(commands: Any) -> None:
    """Register ``checkpoints`` on the CLI's subparsers."""
    listing = commands.add_parser(
        "checkpoints", help="one job's checkpoints, resume target and best checkpoint"
    )
    listing.add_argument("--job", required=True, help="the job")
    listing.add_argument("--best", metavar="METRIC", help="name the best by loss or a metrics key")
    listing.add_argument("--mode", default="min", help="min (default) or max: which value is best")
    listing.add_argument(
        "--no-check-files",
        dest="check_files",
        action="store_false",
        help="do not skip checkpoints whose files are gone",
    )
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")


def gather_checkpoints(
    database_url: str, job_id: str, *, best: str | None, mode: str, check_files: bool
) -> dict[str, Any]:
    """Everything the command shows, as one JSON-ready document."""
    from lambda_writer import connect_url, job_checkpoints
    from trainer_client.restart.best import best_complete_checkpoint
    from trainer_client.restart.lookup import latest_complete_checkpoint

    metric = best or "loss"
    with connect_url(database_url, autocommit=True) as conn:
        rows = job_checkpoints(conn, job_id, metric=metric)
        found = _last_restart_found(conn, job_id)
    latest = latest_complete_checkpoint(job_id, database_url=database_url, check_files=check_files)
    values = sum(1 for r in rows if r.is_complete and r.value is not None)
    top = (
        None
        if best is None
        else best_complete_checkpoint(
            job_id,
            metric=best,
            mode="max" if mode == "max" else "min",
            database_url=database_url,
            check_files=check_files,
        )
    )
    return {
        "job_id": job_id,
        "metric": metric,
        "mode": mode,
        "checkpoints": [
            {
                "step": r.step,
                "epoch": r.epoch,
                "run_attempt": r.run_attempt,
                "world_size": r.world_size,
                "shards_present": r.shards_present,
                "is_complete": r.is_complete,
                "superseded_rows": r.superseded_rows,
                "value": r.value,
                "restart_found": found.get(r.step),
            }
            for r in rows
        ],
        "resume": None if latest is None else {"step": latest.step, "path": latest.path},
        "no_best": None if best is None or top is not None else _no_best(values, check_files),
        "best": None
        if top is None
        else {
            "metric": top.metric,
            "mode": top.mode,
            "step": top.step,
            "value": top.value,
            "path": top.path,
        },
    }


# What the job's newest restart found wrong with the checkpoints it passed over (its record's
# skipped candidates, migration 0017): a damaged or diverged one stays "complete" in the rows.
_LAST_RESTART = """
SELECT run_attempt, skipped FROM training_job_restarts
WHERE job_id = %s ORDER BY restarted_at DESC, run_attempt DESC LIMIT 1
"""


def _last_restart_found(conn: Any, job_id: str) -> dict[int, dict[str, Any]]:
    """step -> {kind, reason, run_attempt} of what the newest restart passed over, and why."""
    import psycopg

    try:
        with conn.transaction():
            row = conn.execute(_LAST_RESTART, (job_id,)).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege):
        return {}
    if row is None:
        return {}
    attempt, skipped = row
    return {
        int(s["step"]): {"kind": s["kind"], "reason": s["reason"], "run_attempt": int(attempt)}
        for s in skipped or []
    }


def _no_best(complete_with_value: int, check_files: bool) -> str:
    """Why ``--best`` named nothing, from the checkpoints' values (the helper's own rule)."""
    if complete_with_value == 0:
        return "no complete checkpoint has a value of it"
    checked = " (--no-check-files to skip that check)" if check_files else ""
    return (
        f"the {complete_with_value} complete checkpoints with a value failed the files"
        f" check{checked}"
    )


def render_checkpoints(doc: dict[str, Any]) -> str:
    """The document as an 80-column table and two summary lines."""
    lines = [
        f"{'step':>10} {'epoch':>6} {'attempt':>7} {'shards':>13} {'complete':>8} "
        f"{doc['metric'][:16]:>16}  restart found"
    ]
    notes = []
    for c in doc["checkpoints"]:
        shards = f"{c['shards_present']}/{c['world_size']}"
        value = "-" if c["value"] is None else f"{c['value']:.6g}"
        found = c.get("restart_found")
        lines.append(
            f"{c['step']:>10} {c['epoch']:>6} {c['run_attempt']:>7} {shards:>13}"
            f" {'yes' if c['is_complete'] else 'no':>8} {value:>16}"
            + ("" if found is None else f"  {found['kind']}")
        )
        if found is not None and found["kind"] != "incomplete":
            notes.append(
                f"step {c['step']}: {found['kind']} at the restart of run_attempt "
                f"{found['run_attempt']}: {found['reason']}"
            )
    lines += notes
    resume = doc["resume"]
    lines.append(
        "resume target: none"
        if resume is None
        else f"resume target: step {resume['step']} ({resume['path']})"
    )
    best = doc["best"]
    if doc["no_best"] is not None:
        lines.append(f"best {doc['metric']} ({doc['mode']}): none: {doc['no_best']}")
    elif best is not None:
        lines.append(
            f"best {best['metric']} ({best['mode']}): step {best['step']},"
            f" value {best['value']:.6g} ({best['path']})"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """List the job's checkpoints."""
    job_id = check_job_id(args.job)
    if args.best is not None:
        check_metric(args.best)
    if args.mode not in MODES:
        raise ConfigError("--mode", "must be min or max")
    from trainer_client.exceptions import IntegrationError
    from trainer_client.storage.exceptions import StorageError

    try:
        doc = gather_checkpoints(
            settings.require_database_url(),
            job_id,
            best=args.best,
            mode=args.mode,
            check_files=args.check_files,
        )
    except (IntegrationError, StorageError) as exc:
        raise PipelineError(str(exc)) from None
    print(json.dumps(doc, indent=2) if args.json else render_checkpoints(doc))
    return EXIT_NO_BEST if doc["no_best"] is not None else EXIT_OK
