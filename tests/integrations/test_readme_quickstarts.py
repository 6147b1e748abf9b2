"""README.md's quick starts, run as a reader would paste them: each records its checkpoints.

Every Python block of the README's "Quick start" runs in a process of its own, one rank as
torchrun would start it, against the local pipeline (moto's SQS, the real writer, the test
database). The only edits are what a test must make: a tiny model and data defined before the
block, steps small enough to reach two saves, the spool and checkpoints under a temporary
directory instead of ``/mnt/efs``. Then ``ckpt-pipeline status`` and the resume block read back
what landed, as the README says they do.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.trainer_client.helpers import rows_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

# What the README leaves to the reader (model, data, a training step), defined before its block.
_TINY_HF = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1))
class Data(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i):
        x = torch.arange(8) % 64
        return {"input_ids": x, "labels": x}
data = Data()
"""
_TINY_LIGHTNING = """
import torch, lightning.pytorch as pl
class Model(pl.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i): return self.layer(batch).sum()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
class Data(pl.LightningDataModule):
    def train_dataloader(self): return torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
model, data = Model(), Data()
"""
_TINY_TORCH = """
import torch
model = torch.nn.Linear(4, 2); loader = [0] * 10; epochs = 2; steps = 4; batches = iter(range(9))
def train_one_epoch(model, loader): return 0.25
def train_step(model, batch): return 0.5
"""

# heading -> (job id, what runs before the block, (README text, what the test runs instead))
QUICK_STARTS: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "### Hugging Face `Trainer`": (
        "run3",
        _TINY_HF,
        (("save_steps=500", "save_steps=2, max_steps=4, report_to=[]"),),
    ),
    "### A plain training loop": ("qs-plain", _TINY_TORCH, ()),
    "### Lightning 2.x": (
        "qs-lightning",
        _TINY_LIGHTNING,
        (
            # ModelCheckpoint keeps one file by default: two steps apart, step 2's file is gone
            # before its background finish can report it (dropped, as a rotated file must be).
            # Every 500 steps that race is not there; here keep both files to record both.
            ("every_n_train_steps=500", "every_n_train_steps=2, save_top_k=-1"),
            (
                'strategy="ddp",',
                'strategy="ddp", max_steps=4, accelerator="cpu", devices=1, logger=False,'
                " enable_progress_bar=False,",
            ),
        ),
    ),
    "### `torch.distributed.checkpoint` (DCP)": ("qs-dcp", _TINY_TORCH, (("% 500", "% 2"),)),
}


def _block(heading: str, language: str = "python") -> str:
    assert heading in README, f"README.md has no section {heading!r}"
    section = README[README.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"README.md: no {language} block under {heading!r}"
    return match.group(1)


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )


def test_every_quick_start_records_complete_checkpoints(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    with pipeline_factory() as pipeline:
        env = {
            **os.environ,
            **pipeline.client_env(),
            "PYTHONPATH": str(ROOT),
            "CKPT_RESUME_DATABASE_URL": pipeline.database_url,
        }
        for heading, (job, tiny, edits) in QUICK_STARTS.items():
            code = _block(heading)
            for text, instead in edits:
                assert text in code, f"README.md {heading}: expected {text!r}"
                code = code.replace(text, instead)
            code = code.replace("/mnt/efs", str(tmp_path / job))
            # torchrun sets RANK/WORLD_SIZE; the Trainer and Lightning set up their own group.
            rank = {} if "Trainer" in heading or "Lightning" in heading else {"RANK": "0"}
            done = _run(tiny + code, {**env, "CKPT_JOB_ID": job, "WORLD_SIZE": "1", **rank})
            assert done.returncode == 0, f"{heading}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        # The queue's approximate depth can read 0 while a batch is still being written: wait
        # for the rows themselves, up to a minute.
        expected = {job: (2, 2) for job, _, _ in QUICK_STARTS.values()}
        rows = rows_until(
            pipeline.database_url,
            "SELECT job_id, count(*) FILTER (WHERE is_complete), count(*)"
            " FROM training_checkpoints GROUP BY job_id",
            lambda rows: {job: (complete, total) for job, complete, total in rows} == expected,
        )
        found = {job: (complete, total) for job, complete, total in rows}
        assert found == expected

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
        assert re.search(r"run3\s+2/2\s+4\b", shown.stdout), shown.stdout
        resume = (
            _block(see).replace("trainer.train(", "print(").replace("resume_from_checkpoint=", "")
        )
        answer = _run(resume, {**env, "CKPT_READ_DATABASE_URL": pipeline.database_url})
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip().endswith("checkpoint-4"), answer.stdout
