"""A launcher for the integrations' real jobs: fork one process per rank, as torchrun would.

The parent imports the frameworks once and forks after, so the ranks do not import them again (on
a shared 2-core machine that import is most of a short run's time). Each rank gets torchrun's
environment contract (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); when one dies the
launcher SIGKILLs the rest, since a survivor would wait in a gloo collective forever.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable

from tests.torchrun import free_port, torchrun_env


def fork_ranks(world_size: int, run_rank: Callable[[int], int]) -> int:
    """Run ``run_rank(rank)`` in ``world_size`` forked processes; 0 if every rank returned 0."""
    port = free_port()
    pids: dict[int, int] = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(torchrun_env(rank, world_size, port))
                code = run_rank(rank)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # never run the launcher's own exit handlers in a rank
        pids[pid] = rank
    failed = False
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid, -1)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            print(f"launcher: rank {rank} exited {code}", file=sys.stderr, flush=True)
            failed = True
            for other in pids:
                os.kill(other, signal.SIGKILL)
    return 1 if failed else 0
