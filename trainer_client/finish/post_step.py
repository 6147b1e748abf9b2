"""Post-steps: the finisher's extension point (an upload, say), run after fsync and hashing.

A post-step is any object with a ``name`` and a ``run(job, params)`` method (the
:class:`PostStep` protocol), registered with ``CheckpointReporter(post_steps=[...])`` and asked for
per save with :class:`~trainer_client.finish.finish_job.PostStepCall` ``(name, params)``. ``run``
gets a :class:`FinishingJob` (the durable, hashed files) and returns the report fields to change
(for example ``{"uri": "s3://bucket/prefix/", "extra": {"s3_etags": ...}}``; ``extra`` is merged) or
None. It raises :class:`DropCheckpoint` to drop the job for good, :class:`FinishDeferred` to leave
it on disk for the next start, anything else to be retried (1 s doubling to 60 s, the job keeping
its slot under ``max_finishing``). It must be idempotent (a killed upload is redone at the next
start), and may keep its progress in ``job.state_dir``. It should poll ``job.should_stop()``
between long operations and raise :class:`FinishDeferred` when it returns True, so that close()
keeps its deadline.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainer_client._log import warn_visibly
from trainer_client.exceptions import DropCheckpoint, FinishDeferred
from trainer_client.finish.finish_job import FinishJob, PostStepCall

_RETRY_CAP_S = 60.0


@dataclass(frozen=True)
class FinishingJob:
    """What a post-step sees: the job, its durable files, their sizes and (if asked) digests."""

    job: FinishJob
    paths: tuple[Path, ...]
    sizes: tuple[int, ...]
    digests: tuple[str, ...] | None
    state_dir: Path
    should_stop: Callable[[], bool]


@runtime_checkable
class PostStep(Protocol):
    """An extra stage of finishing, after fsync and hashing and before the report."""

    name: str

    def run(self, job: FinishingJob, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Do the step (idempotently); return report fields to change, or None."""
        ...


def run_post_steps(
    context: FinishingJob,
    steps: Mapping[str, PostStep],
    stopping: threading.Event,
    log: logging.LoggerAdapter[logging.Logger],
) -> dict[str, Any]:
    """Run the job's post-steps in order; the report fields they change (``extra`` merged).

    Raises DropCheckpoint (the step's message, named) or FinishDeferred (a step not registered,
    the reporter closing during a retry's wait)."""
    updates: dict[str, Any] = {}
    for call in context.job.post:
        step = steps.get(call.name)
        if step is None:
            raise FinishDeferred(f"post-step {call.name!r} is not registered in this reporter")
        changed = _run_one(step, context, call, stopping, log)
        for key, value in (changed or {}).items():
            if key == "extra":
                updates["extra"] = {**updates.get("extra", {}), **dict(value)}
            else:
                updates[key] = value
    return updates


def _run_one(
    step: PostStep,
    context: FinishingJob,
    call: PostStepCall,
    stopping: threading.Event,
    log: logging.LoggerAdapter[logging.Logger],
) -> Mapping[str, Any] | None:
    """Retry a step's failures with a backoff (1 s doubling to 60 s) while the reporter runs,
    holding the job's slot: the bound, not the disk, absorbs an outage.

    The first failure of each checkpoint reaches stderr whatever the logging setup, with the
    store's own error (a bucket that is gone, a permission taken away): an upload that cannot
    succeed must not look like a slow one. The retries' lines go to the library's logger only;
    a job left by close() names the last error in its deferral.
    """
    for attempt in itertools.count():
        try:
            return step.run(context, call.params)
        except DropCheckpoint as exc:
            raise DropCheckpoint(f"post-step {call.name!r}: {exc}") from None
        except FinishDeferred:
            raise
        except Exception as exc:
            delay = min(_RETRY_CAP_S, 2.0**attempt)
            error = f"{type(exc).__name__}: {exc}"
            say = warn_visibly if attempt == 0 else _warning
            say(
                log,
                "post-step %r of step %s failed (%s); retrying in %.0f s, the checkpoint is not"
                " reported until it succeeds",
                call.name,
                context.job.step,
                error,
                delay,
            )
            if stopping.wait(delay):
                raise FinishDeferred(
                    f"the reporter is closing; post-step {call.name!r} last failed: {error}"
                ) from exc
    raise AssertionError("unreachable")


def _warning(log: logging.LoggerAdapter[logging.Logger], msg: str, *args: Any) -> None:
    log.warning(msg, *args)
