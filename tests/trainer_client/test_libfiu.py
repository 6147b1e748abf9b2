"""EIO/ENOSPC injected by libfiu into write/fsync/open of a real process appending to the spool:
each append either returns with its record durable or raises ``SpoolUnwritable``; a reopen (no
faults) holds exactly the records whose append returned."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer_client.helpers import REPO_ROOT, child_env
from trainer_client.report.spool import Spool

FIU_RUN = shutil.which("fiu-run")
FIU_CTRL = shutil.which("fiu-ctrl")
pytestmark = pytest.mark.skipif(
    FIU_RUN is None or FIU_CTRL is None,
    reason="libfiu missing: bash .ci/setup-faults.sh (apt-get install fiu-utils)",
)

_CHILD = """
import json, os, sys
from pathlib import Path
from trainer_client.report.spool import Spool
from trainer_client.exceptions import SpoolUnwritable
import trainer_client.report.reporter  # every import done before the faults start
print("ready", flush=True)
sys.stdin.readline()  # the parent enables the fault (fiu-ctrl), then says go
spool = None
while spool is None:  # open() itself may be failed by libfiu: retry, as a restart would
    try:
        spool = Spool(Path(sys.argv[1]), 0, max_bytes=1 << 30, max_records=1 << 20,
                      compact_threshold_bytes=1)
    except OSError:
        pass
returned, refused = [], 0
for n in range(300):
    try:
        seq = spool.append(json.dumps({"n": n}))
    except SpoolUnwritable:
        refused += 1
        continue
    returned.append(seq)
    if len(returned) % 4 == 0:
        spool.ack([returned[-4]])  # compactions run too, under the same faults
        returned[-4] = -1
# The fault hits every write() of this process, stdout's too (EIO, ENOSPC, EFAULT...): the
# result goes out through os.write, retried and resumed until the whole line is out.
out = (json.dumps({"kept": [s for s in returned if s >= 0], "refused": refused}) + "\\n").encode()
while out:
    try:
        out = out[os.write(1, out):]
    except OSError:
        pass
"""


@pytest.mark.parametrize(
    "fault",
    [
        "posix/io/rw/write,probability=0.05",
        "posix/io/sync/fsync,probability=0.05",
        "posix/io/oc/open,probability=0.05",
    ],
)
def test_injected_io_errors_keep_exactly_the_returned_records(tmp_path: Path, fault: str) -> None:
    assert FIU_RUN is not None and FIU_CTRL is not None
    # -x: remote control on; faults are enabled only once the interpreter has imported all.
    child = subprocess.Popen(
        [FIU_RUN, "-x", sys.executable, "-c", _CHILD, str(tmp_path)],
        env=child_env(),
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    subprocess.run([FIU_CTRL, "-c", f"enable_random name={fault}", str(child.pid)], check=True)
    child.stdin.write("go\n")
    child.stdin.flush()
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-2000:]
    done = subprocess.CompletedProcess(child.args, 0, out, err)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    spool = Spool(tmp_path, 0, max_bytes=1 << 30, max_records=1 << 20, compact_threshold_bytes=1)
    records = spool.peek(1 << 20)
    spool.close()
    if "open" not in fault:
        assert result["refused"] > 0  # the fault fired (p=0.05 over 300 appends)
    kept = set(result["kept"])
    seqs = {r.seq for r in records}
    # Every returned, un-acked record is there; an ack the fault kept off disk may bring an
    # acknowledged one back (a deduplicated resend), never a refused or garbled one.
    assert kept <= seqs
    assert all(json.loads(r.body) for r in records)
