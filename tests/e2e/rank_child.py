"""A training rank for the fault matrix: ``python -m tests.e2e.rank_child '<json args>'``.

``train``: resume from the step persisted in ``progress_file`` (written only after report()
returned, i.e. once the report is durable), report the remaining steps with a flush every
``flush_every`` steps, print one line per event so the driver can aim its SIGKILL, and exit 0
once everything is acknowledged.

``hold``: report ``steps`` steps while SQS is unreachable, print ``pending N`` once a send has
failed, then keep "training" until a signal ends the process; with a Spot notice it prints
``spot-flushed N`` once the notice arrived and the spool is empty.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.helpers import shard_uri
from trainer_client import CheckpointReporter


def _say(line: str) -> None:
    print(line, flush=True)


def _resume_step(progress: Path) -> int:
    try:
        return int(progress.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _persist_step(progress: Path, next_step: int) -> None:
    # tmp + rename: a SIGKILL leaves the old or the new value, never a torn one. No fsync: the
    # page cache outlives a killed process, and only process kills are simulated here.
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(str(next_step))
    tmp.replace(progress)


def _reporter(args: dict[str, Any]) -> CheckpointReporter:
    return CheckpointReporter(
        args["queue_url"],
        job_id=args["job_id"],
        spool_dir=args["spool_dir"],
        rank=args["rank"],
        world_size=args["world_size"],
        run_attempt=0,
        endpoint_url=args["endpoint_url"],
        spot_poll=args.get("spot_poll", False),
        **args.get("tuning", {}),
    )


def train(args: dict[str, Any]) -> int:
    """Report the steps not yet persisted as done; 0 once all are acknowledged by SQS."""
    progress = Path(args["progress_file"])
    job, rank = args["job_id"], args["rank"]
    start = _resume_step(progress)
    with _reporter(args) as reporter:
        _say(f"ready {start}")
        for step in range(start, args["steps"]):
            reporter.report(step=step, epoch=step, uri=shard_uri(job, step, rank), loss=0.5)
            _persist_step(progress, step + 1)
            _say(f"reported {step}")
            if (step + 1) % args["flush_every"] == 0:
                _say("flushing")
                reporter.flush(timeout=30)
            time.sleep(args["pause_s"])  # the training step between two checkpoints
        _say("flushing")
        flushed = reporter.flush(timeout=60)
        _say(f"flushed {flushed}")
    return 0 if flushed else 1


def hold(args: dict[str, Any]) -> int:
    """Spool reports SQS cannot take now, then train on until a signal ends the process."""
    job, rank = args["job_id"], args["rank"]
    with _reporter(args) as reporter:
        for step in range(args["steps"]):
            reporter.report(step=step, epoch=step, uri=shard_uri(job, step, rank), loss=0.5)
        while reporter.last_error is None:
            time.sleep(0.01)
        _say(f"pending {reporter.pending}")
        announced = False
        while True:
            if not announced and reporter.spot_interruption is not None and not reporter.pending:
                _say(f"spot-flushed {reporter.pending}")
                announced = True
            time.sleep(0.01)


def main() -> int:
    args = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return train(args) if args["mode"] == "train" else hold(args)


if __name__ == "__main__":
    sys.exit(main())
