"""What the restart says, on stderr whatever the logging setup (``trainer_client._log.say``):
one line with the decision and why, a warning for everything newer that it did not resume from,
and the restore's progress when it takes more than a few seconds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer_client._log import say
from trainer_client.restart.decide import Decision, describe_skipped
from trainer_client.storage.restore_fetch import FetchTrace

_log = logging.getLogger("trainer_client.restart.resume")

# A restore says how far it is after this long, then at this interval.
PROGRESS_AFTER_S = 5.0
# Spools of other jobs named when this job has nothing.
_OTHER_JOBS_NAMED = 5


def tell_decision(
    job_id: str,
    decision: Decision,
    states: Sequence[Any],
    decided_s: float,
    *,
    loop_after: int = 0,
) -> None:
    """One line: the step resumed from (or none), its source, the launch's attempt, and every
    newer checkpoint passed over and why; then one warning per sign of something newer."""
    launch = decision.launch
    attempt = "" if launch is None else f"; this launch reports as run_attempt {launch.run_attempt}"
    named = "; ".join(describe_skipped(s) for s in decision.skipped)
    skipped = f"; skipped: {named}" if named else ""
    point = decision.point
    if point is None:
        say(
            _log,
            logging.INFO,
            "restart of job %s: no complete, intact checkpoint: starting from scratch "
            "(decided in %.2f s%s)%s",
            job_id,
            decided_s,
            attempt,
            skipped,
        )
    else:
        source = "restored from the store" if decision.objects else "read where it was written"
        say(
            _log,
            logging.INFO,
            "restart of job %s: resuming from step %s (run_attempt %s, %s ranks, %s: %s; "
            "decided in %.2f s%s)%s",
            job_id,
            point.step,
            point.run_attempt,
            point.world_size,
            source,
            point.path,
            decided_s,
            attempt,
            skipped,
        )
    if loop_after and len(decision.same_step_restarts) >= loop_after - 1:
        _tell_loop(job_id, decision)
    unsent = sum(getattr(s, "unsent", 0) for s in states)
    if unsent and point is not None:
        say(
            _log,
            logging.WARNING,
            "job %s: %s report(s) of an earlier launch are still unsent (%s); a newer "
            "checkpoint than step %s may exist: they are sent later",
            job_id,
            unsent,
            next((s.send_error for s in states if getattr(s, "send_error", None)), "no error"),
            point.step,
        )
    if decision.unwritten and point is not None:
        step, attempt_of, rank = decision.unwritten[0]
        say(
            _log,
            logging.WARNING,
            "job %s: %s report(s) SQS accepted were not written by the deadline (first: step "
            "%s rank %s attempt %s): answered from what the database holds; check the writer "
            "and the DLQ (ckpt-pipeline status)",
            job_id,
            decision.unwritten_reports,
            step,
            rank,
            attempt_of,
        )
    if decision.store_newer is not None and point is not None:
        step, where = decision.store_newer
        say(
            _log,
            logging.WARNING,
            "job %s: %s (step %s) is in the store but not complete in the database (resuming "
            "from step %s): its reports may have been lost with a node-local spool; "
            "ckpt-pipeline reconcile --job %s --store %s --backfill reports it",
            job_id,
            where,
            step,
            point.step,
            job_id,
            where.rsplit("/", 2)[0] if where.endswith("/") else where.rsplit("/", 1)[0],
        )


def _tell_loop(job_id: str, decision: Decision) -> None:
    earlier = ", ".join(map(str, decision.same_step_restarts))
    if decision.stepped_back_from is not None:
        now = (
            f"stepping back from step {decision.stepped_back_from} to "
            f"{'scratch' if decision.point is None else f'step {decision.point.step}'} "
            "(step_back_on_loop)"
        )
        step = decision.stepped_back_from
    else:
        assert decision.point is not None or not decision.same_step_restarts
        step = decision.point.step if decision.point is not None else 0
        now = (
            "resuming from it again: if it crashes the job every time (a NaN on load, an OOM "
            "at the first step), pass step_back_on_loop=True to resume from the one before"
        )
    say(
        _log,
        logging.WARNING,
        "job %s: restart loop: this is restart %s in a row from step %s without a newer "
        "checkpoint completing (the restarts of run_attempt %s resumed from it); %s",
        job_id,
        len(decision.same_step_restarts) + 1,
        step,
        earlier,
        now,
    )


def name_other_jobs(spool_dir: Path, job_id: str) -> None:
    """When this job has nothing, name the other jobs whose spools this directory holds: a job
    id that changed between launches (torchrun's random run id) finds nothing of its own."""
    try:
        others = sorted(
            p.name
            for p in spool_dir.iterdir()
            if p.is_dir() and p.name != job_id and any(p.glob("rank-*.spool"))
        )
    except OSError:
        return
    if others:
        named = ", ".join(others[:_OTHER_JOBS_NAMED])
        more = f" and {len(others) - _OTHER_JOBS_NAMED} more" if len(others) > 5 else ""
        say(
            _log,
            logging.WARNING,
            "job %s has no checkpoint, but the spool directory %s holds spools of other jobs: "
            "%s%s. If one of them is this job under another id, set CKPT_JOB_ID to it",
            job_id,
            spool_dir,
            named,
            more,
        )


def size(count: int) -> str:
    """Bytes in MB (decimal) with one decimal: what the restart's lines print."""
    return f"{count / 1e6:.1f} MB"


class RestoreProgress:
    """Says, every ``interval_s`` once ``after_s`` passed, how much of a restore is written."""

    def __init__(self, trace: FetchTrace, total: int, *, after_s: float = PROGRESS_AFTER_S) -> None:
        self._trace, self._total, self._after = trace, total, after_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restore-progress", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> RestoreProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self._after):
            elapsed = time.monotonic() - self._started
            written = self._trace.written
            if not written:
                continue  # another rank of this node is restoring: it says how far it is
            say(
                _log,
                logging.INFO,
                "restoring: %s of %s written in %.0f s (%.1f MB/s)",
                size(written),
                size(self._total),
                elapsed,
                written / 1e6 / max(elapsed, 1e-9),
            )
