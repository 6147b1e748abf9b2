"""A real post-step that holds the finisher until the test releases it (a file appears).

Registered like any post-step (``post_steps=[HoldUntilReleased()]``, asked for with
``PostStepCall("hold", {"dir": ...})``): it marks ``held-<step>`` when it starts holding a
checkpoint and waits for ``release-<step>`` (or ``release-all``). The same class runs in a rank
process and in the restarted reporter of a test, so a job killed while held is finished later
exactly as configured.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer_client import FinishDeferred, FinishingJob, PostStepCall


class HoldUntilReleased:
    """Waits for the test's release file of the job's step; stops waiting when closing."""

    name = "hold"

    def run(self, job: FinishingJob, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Mark the hold, then wait for the release (polling: it crosses processes)."""
        directory = Path(params["dir"])
        step = job.job.step
        (directory / f"held-{step}").touch()
        while not (
            (directory / f"release-{step}").exists() or (directory / "release-all").exists()
        ):
            if job.should_stop():
                raise FinishDeferred("closing while held")
            time.sleep(0.01)
        return None


def hold(directory: Path) -> PostStepCall:
    """The call that holds every checkpoint of a save in ``directory``'s releases."""
    directory.mkdir(parents=True, exist_ok=True)
    return PostStepCall("hold", {"dir": str(directory)})


def release(directory: Path, step: int | str) -> None:
    """Let the held checkpoint of ``step`` (or ``"all"``) go on."""
    (directory / f"release-{step}").touch()
