"""DeepSpeed's CPU communication op, built once per checkout before any DeepSpeed rank starts.

DeepSpeed's CPU accelerator JIT-compiles its shared-memory op (``deepspeed_shm_comm``) the first
time a process initializes its communication backend. On a fresh checkout that compile takes one
to several minutes on two cores, inside the rank processes, whose timeouts then kill it midway:
the build folder keeps its ``lock`` and every later rank waits on it until its own timeout. Built
here, outside any rank's timeout, the ranks find the op ready and load it in about a second.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# The same call DeepSpeed's TorchBackend makes (deepspeed/comm/torch.py: build_shm_op).
_BUILD = """
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load()
"""
# A cold compile took ~2 min at load 12 here; the limit only stops a build that hangs.
BUILD_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """Build (or find built) the op in ``TORCH_EXTENSIONS_DIR`` that the ranks inherit."""
    done = subprocess.run(
        [sys.executable, "-c", _BUILD],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"DeepSpeed's CPU op did not build:\n{done.stderr[-4000:]}"
