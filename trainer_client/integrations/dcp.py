"""Plain ``torch.distributed.checkpoint`` (FSDP2, DDP, any state dict): report each rank's part.

Synchronous save::

    dcp.save(state, checkpoint_id=f"/mnt/efs/ckpt/step-{step}")
    report_dcp_saved(reporter, f"/mnt/efs/ckpt/step-{step}", step=step, epoch=epoch, loss=loss)

Asynchronous save (the report follows the future, in its thread; a failed save is never
reported)::

    if recorded is not None:
        recorded.result()  # the previous save is written and handed to the finisher
    future = dcp.async_save(state, checkpoint_id=f"/mnt/efs/ckpt/step-{step}")
    recorded = report_dcp_when_saved(reporter, future, f"/mnt/efs/ckpt/step-{step}", step=step,
                                     epoch=epoch)

Each rank reports the checkpoint directory's URI with its own ``__<rank>_*.distcp`` files; rank 0,
DCP's coordinator, also ``.metadata`` and only once it exists (it is written after every rank's
data, so rank 0's report says the save committed). ``dcp.save`` and the ``async_save`` future
return on every rank only after the coordinator wrote ``.metadata``, so the files are complete
when these functions look. ``reporter.config.rank`` must be the rank DCP saves as (the default
process group, coordinator rank 0). ``latest_complete_checkpoint(...).path`` is the directory to
pass to ``dcp.load(..., checkpoint_id=...)``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ckpt_contract import InvalidMessage
from trainer_client.exceptions import ReporterError
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.integrations._paths import local_path
from trainer_client.integrations.sharded import finish_rank_files, rank_files
from trainer_client.report.reporter import CheckpointReporter
from trainer_client.torch_integration import SaveFailures, completion_future, save_failure

_log = logging.getLogger(__name__)
FRAMEWORK = "torch.distributed.checkpoint"


def report_dcp_saved(
    reporter: CheckpointReporter,
    checkpoint_dir: str | os.PathLike[str],
    *,
    step: int,
    epoch: int,
    loss: Any = None,
    checksums: bool = False,
) -> Future[FinishOutcome]:
    """Hand this rank's files of the DCP checkpoint in ``checkpoint_dir`` (after ``dcp.save``)
    to the reporter's finisher, which reports them once durable; returns at once.

    Raises ``IntegrationError`` when its files (rank 0: and ``.metadata``) are not there.
    """
    directory = local_path(checkpoint_dir)
    rank = reporter.config.rank
    files = rank_files(directory, rank=rank, saves_shared=rank == 0)
    return finish_rank_files(
        reporter,
        directory,
        files,
        step=step,
        epoch=epoch,
        loss=loss,
        framework=FRAMEWORK,
        checksums=checksums,
    )


def report_dcp_when_saved(
    reporter: CheckpointReporter,
    save_result: Any,
    checkpoint_dir: str | os.PathLike[str],
    *,
    step: int,
    epoch: int,
    loss: Any = None,
    checksums: bool = False,
) -> Future[None]:
    """Report this rank's part once the ``async_save`` future resolved without error.

    The fields are validated now (``InvalidMessage`` at the call). A failed save, or a report
    that cannot be made, is logged and counted in ``SaveFailures``; ``close()`` waits for it.
    Returns a future that resolves once the report is handed to the finisher (its job on
    durable disk, so a SIGKILL after it is finished at the next start) or given up: wait for
    it, not for the save's, before the next save. The save's future resolves *before* its
    callbacks run, so a loop that waits only for the save can be killed before the hand-over.
    """
    recorded: Future[None] = Future()
    reporter.prepare(step=step, epoch=epoch, uri=Path(local_path(checkpoint_dir)).as_uri())
    future = completion_future(save_result)
    reporter.save_started()

    def _done(done: Any) -> None:
        try:
            exc = save_failure(done)
            if exc is not None:
                SaveFailures.add()
                _log.error(
                    "[job=%s rank=%s] DCP save of step %s failed, not reported: %r",
                    reporter.config.job_id,
                    reporter.config.rank,
                    step,
                    exc,
                )
                return
            report_dcp_saved(
                reporter, checkpoint_dir, step=step, epoch=epoch, loss=loss, checksums=checksums
            )
        except (ReporterError, InvalidMessage, OSError) as error:
            SaveFailures.add()
            _log.error("checkpoint of step %s not reported: %s", step, error)
        finally:
            reporter.save_finished()
            recorded.set_result(None)

    future.add_done_callback(_done)
    return recorded
