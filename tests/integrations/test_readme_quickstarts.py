"""README.md's code blocks, run as a reader would paste them: each records its checkpoints.

Every Python block runs exactly as printed, in a process of its own, against the local pipeline
(moto's SQS, the real writer, the test database). The only edit is the storage root:
``/mnt/efs`` becomes a temporary directory. What the README leaves to the reader (a model, data,
a training step, the process group) is defined before the block, sized so that the block's own
save intervals (every 500 steps) give two checkpoints. The plain blocks run as one rank; the DCP
block runs as torchrun starts it, two ranks of FSDP2 (``fully_shard``) over gloo, which is where
an ``async_save`` on the training's own group collides with FSDP2's collectives. Then
``ckpt-pipeline status`` and the resume block read back what landed, as the README says they do,
and every ``make`` line names a target of the Makefile (``make -n``: running them here would
run this suite inside itself).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.torchrun import free_port
from tests.trainer_client.helpers import rows_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

# What the README leaves to the reader, defined before its block. The Trainer trains 3 epochs by
# default (batch 8): 167 batches an epoch give 501 steps, saved at 500 and at the end.
_TINY_HF = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1))
class Data(torch.utils.data.Dataset):
    def __len__(self): return 8 * 167
    def __getitem__(self, i):
        x = torch.arange(8) % 64
        return {"input_ids": x, "labels": x}
data = Data()
"""
# One epoch of 1,000 batches (the model ends its training there): steps 1-1,000.
_TINY_LIGHTNING = """
import torch, lightning.pytorch as pl
class Model(pl.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i): return self.layer(batch).sum()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
    def on_train_epoch_end(self): self.trainer.should_stop = True
class Data(pl.LightningDataModule):
    def train_dataloader(self): return torch.utils.data.DataLoader(torch.randn(1000, 4))
model, data = Model(), Data()
"""
_TINY_TORCH = """
import torch
model = torch.nn.Linear(4, 2); loader = [0] * 10; epochs = 2
def train_one_epoch(model, loader): return 0.25
"""
# torchrun's two ranks: the model sharded with FSDP2 over gloo on the default group, a real
# forward, backward and step each time (FSDP2's all-gathers and reduce-scatters), 501 steps.
_FSDP2_GLOO = """
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 501
batches = iter(lambda: torch.randn(8, 16), None)
def train_step(model, batch):
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()
"""
# The resume block's `trainer`: the HF Trainer's train(), printing where it would resume.
_TRAINER_STANDIN = """
class _Trainer:
    def train(self, resume_from_checkpoint=None): print(resume_from_checkpoint)
trainer = _Trainer()
"""

# heading -> (job id, what runs before the block, (the steps it saves))
ONE_RANK: dict[str, tuple[str, str, tuple[int, int]]] = {
    "### Hugging Face `Trainer`": ("run3", _TINY_HF, (500, 501)),
    "### A plain training loop": ("qs-plain", _TINY_TORCH, (0, 1)),
    "### Lightning 2.x": ("qs-lightning", _TINY_LIGHTNING, (500, 1000)),
}
DCP = "### `torch.distributed.checkpoint` (DCP)"


def _block(heading: str, language: str = "python") -> str:
    assert heading in README, f"README.md has no section {heading!r}"
    section = README[README.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"README.md: no {language} block under {heading!r}"
    return match.group(1)


def _as_printed(heading: str, root: Path) -> str:
    """The block as printed, its storage root under ``root``."""
    return _block(heading).replace("/mnt/efs", str(root))


def _run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run to the end, or stop it at ``timeout`` (a hung collective): SIGTERM first, which
    torchrun passes on to its workers (each in a session of its own), then SIGKILL. The output
    goes to files: a worker that outlives its launcher would hold a pipe open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True, start_new_session=True
        )
        try:
            child.wait(timeout=timeout)
            hung = ""
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            hung = f"\n[stopped after {timeout} s: hung]"
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, child.returncode, out.read(), err.read() + hung)


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-c", code], env, cwd)


def _complete(
    database_url: str, expected: dict[str, list[tuple[int, bool]]]
) -> dict[str, list[tuple[object, object]]]:
    # The queue's approximate depth can read 0 while a batch is still being written: wait for
    # the rows themselves, up to a minute.
    rows = rows_until(
        database_url,
        "SELECT job_id, step, is_complete FROM training_checkpoints ORDER BY job_id, step",
        lambda rows: _by_job(rows) == expected,
    )
    return _by_job(rows)


def _by_job(rows: list[tuple[object, ...]]) -> dict[str, list[tuple[object, object]]]:
    found: dict[str, list[tuple[object, object]]] = {}
    for job, step, complete in rows:
        found.setdefault(str(job), []).append((step, complete))
    return found


def test_every_one_rank_quick_start_records_its_checkpoints_and_resumes(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    with pipeline_factory() as pipeline:
        env = {
            **os.environ,
            **pipeline.client_env(),
            "PYTHONPATH": str(ROOT),
            "CKPT_RESUME_DATABASE_URL": pipeline.database_url,
            # One thread per process: torch's default (one per core) on a shared machine makes
            # a tiny model's step a hundred times slower.
            "OMP_NUM_THREADS": "1",
        }
        for heading, (job, tiny, _steps) in ONE_RANK.items():
            workdir = tmp_path / job
            workdir.mkdir()
            # torchrun sets RANK/WORLD_SIZE; the Trainer and Lightning set up their own group.
            rank = {} if "Trainer" in heading or "Lightning" in heading else {"RANK": "0"}
            done = _python(
                tiny + _as_printed(heading, workdir),
                {**env, "CKPT_JOB_ID": job, "WORLD_SIZE": "1", **rank},
                workdir,
            )
            assert done.returncode == 0, f"{heading}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        expected = {job: [(s, True) for s in steps] for job, _, steps in ONE_RANK.values()}
        assert _complete(pipeline.database_url, expected) == expected
        # Lightning's block keeps more than one checkpoint (ModelCheckpoint's default keeps one,
        # the previous gone while the next is written): both files are there to resume from
        kept = sorted(p.name for p in (tmp_path / "qs-lightning" / "ckpt" / "run3").iterdir())
        assert kept == ["epoch=0-step=1000.ckpt", "epoch=0-step=500.ckpt"], kept

        # "See it, and resume from it": the status command and the resume block, as written.
        see = "### See it, and resume from it"
        status = shlex.split(_block(see, "bash").split("#")[0])
        shown = subprocess.run(
            [str(Path(sys.executable).with_name("ckpt-pipeline")), *status[1:]],
            env={**env, "DATABASE_URL": pipeline.database_url, "COLUMNS": "120"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"run3\s+2/2\s+501\b", shown.stdout), shown.stdout
        answer = _python(
            _TRAINER_STANDIN + _block(see),
            {**env, "CKPT_READ_DATABASE_URL": pipeline.database_url},
            tmp_path,
        )
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip().endswith("checkpoint-501"), answer.stdout


def test_the_dcp_quick_start_saves_under_fsdp2_on_two_gloo_ranks(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    # GIVEN the README's DCP block as printed, in a 2-rank torchrun job whose model FSDP2 shards
    # over gloo on the default group
    (tmp_path / "train.py").write_text(_FSDP2_GLOO + _as_printed(DCP, tmp_path))
    with pipeline_factory() as pipeline:
        env = {
            **os.environ,
            **pipeline.client_env(),
            "PYTHONPATH": str(ROOT),
            "CKPT_JOB_ID": "qs-dcp",
            "OMP_NUM_THREADS": "1",
        }
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        rdzv = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
        # WHEN it runs (training and saving: two minutes are ample; a hang is killed then)
        done = _run([*torchrun, *rdzv, "train.py"], env, tmp_path, timeout=180)
        # THEN it ends, and both its checkpoints are complete from both ranks
        assert done.returncode == 0, f"{done.stdout[-2000:]}{done.stderr[-6000:]}"
        expected = {"qs-dcp": [(0, True), (500, True)]}
        assert _complete(pipeline.database_url, expected) == expected


def test_every_make_line_names_a_target() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    lines = [line.split("#")[0].split() for block in blocks for line in block.splitlines()]
    targets = [words[1] for words in lines if words[:1] == ["make"] and len(words) > 1]
    assert {"demo", "test", "lint", "bench", "localstack", "setup"} <= set(targets), targets
    for target in targets:
        # A dry run: the target exists and its recipe expands (no recipe here uses $(MAKE)).
        dry = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert dry.returncode == 0, f"make {target}: {dry.stderr}"
