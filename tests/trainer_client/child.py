"""A training process for the process-level tests: ``python -m tests.trainer_client.child ARGS``.

Reports ``count`` checkpoints, prints ``spooled`` once they are on disk (and, with
``wait_for_failure``, once the sender has failed at least once), then either SIGKILLs itself
or keeps "training" until a signal ends it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from types import FrameType

from trainer_client import CheckpointReporter


def _previous_handler(signum: int, frame: FrameType | None) -> None:
    print("previous handler ran", flush=True)
    sys.exit(7)


def main() -> int:
    """Run the scenario described by the JSON argument."""
    args = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if args.get("python_handler"):
        signal.signal(signal.SIGTERM, _previous_handler)
    with CheckpointReporter(
        args["queue_url"],
        job_id=args["job_id"],
        spool_dir=args["spool_dir"],
        rank=args.get("rank", 0),
        world_size=args.get("world_size", 1),
        endpoint_url=args["endpoint_url"],
        spot_poll=False,
        connect_timeout_s=0.5,
        **args.get("tuning", {}),
    ) as reporter:
        for step in range(args["count"]):
            reporter.report(
                step=step, epoch=0, uri=f"file:///ckpt/step-{step}", loss=1.0 / (step + 1)
            )
        if args.get("wait_for_failure"):
            while reporter.last_error is None:
                time.sleep(0.01)
        print(f"spooled {reporter.pending}", flush=True)
        if args.get("sigkill"):
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # the training loop goes on until a signal ends the process
            time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
