"""A plain training loop of two gloo ranks that reports each rank's file per checkpoint, as the
README's restart block does: every rank calls ``resume(reporter)`` first (no attempt passed).

``python -m tests.integrations.relaunch_job '<json options>'``:

* ``steps``: the checkpoints to save, after the one resumed from;
* ``die_rank``/``die_at_step``: that rank's report of that step is spooled with its SQS frozen
  (tests/integrations/sqs_gate.py), then it SIGKILLs itself once rank 0's report of the step is
  in the database (rank 0 then waits in a collective until the launcher kills it);
* every rank writes ``launch-<rank>.json`` (the launch it reports as, the step resumed from) into
  ``progress_dir``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tests.integrations.ranks import fork_ranks
from tests.integrations.sqs_gate import SqsGate, die_when_spooled
from trainer_client import CheckpointReporter
from trainer_client.restart.resume import resume

WORLD_SIZE = 2


def run_rank(rank: int, options: dict[str, Any]) -> int:
    gate: SqsGate | None = None
    if options.get("die_rank") == rank:
        gate = SqsGate(os.environ["AWS_ENDPOINT_URL"])
        gate.route_sqs_here()  # before the reporter builds its SQS client
    dist.init_process_group("gloo")
    reporter = CheckpointReporter(install_signal_handler=False, spot_poll=False)
    resumed = resume(reporter, database_url=options["database_url"])
    launch = reporter.launch
    assert launch is not None
    Path(options["progress_dir"], f"launch-{rank}.json").write_text(
        json.dumps(
            {
                "run_attempt": launch.run_attempt,
                "launch_id": launch.launch_id,
                "resumed": None if resumed is None else resumed.step,
            }
        )
    )
    job = reporter.config.job_id
    for step in options["steps"]:
        path = Path(options["ckpt_dir"], job, f"step-{step}", f"rank-{rank}.pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{options['progress_dir']} rank {rank} step {step}".encode())
        dying = gate is not None and step == options["die_at_step"]
        if dying:
            assert gate is not None
            if not reporter.flush(60):
                raise RuntimeError("earlier reports not delivered within 60 s")
            gate.frozen.set()
        reporter.report(step=step, epoch=0, uri=path.as_uri(), loss=1.0 / step)
        if dying:
            die_when_spooled(reporter, step, options["database_url"])
        dist.barrier()  # a checkpoint interval of training, in lockstep
    if not reporter.flush(60):
        raise RuntimeError("reports not delivered within 60 s")
    reporter.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s rank%(process)d %(name)s: %(message)s"
    )
    opts = json.loads(sys.argv[1])
    sys.exit(fork_ranks(WORLD_SIZE, lambda rank: run_rank(rank, opts)))
