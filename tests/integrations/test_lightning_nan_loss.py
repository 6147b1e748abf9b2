"""Issue 32 §2 for Lightning: a NaN loss from step 3 loses no checkpoint, and says so.

One process (a user's script: logging not configured) against the local pipeline; checkpoints
at steps 2, 4 and 6; the logged loss turns NaN at step 3. All three are recorded complete, 4 and
6 with the loss absent and the fact in the shard's extra; stderr has Lightning's warning once
per checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import PipelineFactory
from tests.trainer_client.helpers import rows_until, run_child

pytestmark = pytest.mark.slow

_SCRIPT = """
import math, sys, torch, lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from trainer_client.integrations.lightning import CheckpointReporting

class Model(pl.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        loss = self.layer(batch).sum()
        self.log("train_loss", loss * math.nan if self.global_step >= 2 else loss)
        return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)

reporting = CheckpointReporting(spool_dir=sys.argv[2], loss_metric="train_loss")
trainer = pl.Trainer(
    max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=2, save_top_k=-1),
               reporting],
    plugins=[reporting.checkpoint_io],
)
trainer.fit(Model(), torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4))
"""


def test_a_nan_loss_leaves_every_lightning_checkpoint_recorded(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    with pipeline_factory() as pipeline:
        done = run_child(
            _SCRIPT,
            str(tmp_path / "out"),
            str(tmp_path / "spool"),
            timeout=600,
            **pipeline.client_env(),
            CKPT_JOB_ID="nan-pl",
            WORLD_SIZE="1",
            RANK="0",
        )
        assert done.returncode == 0, done.stderr[-4000:]
        warnings = [line for line in done.stderr.splitlines() if "not finite" in line]
        assert [w.split("(step ")[1].split(")")[0] for w in warnings] == ["4", "6"], done.stderr
        assert "train_loss=nan not finite, recorded as absent" in warnings[0]
        rows = rows_until(
            pipeline.database_url,
            "SELECT c.step, c.is_complete, s.loss IS NULL, s.extra->'non_finite'"
            " FROM training_checkpoints c JOIN training_checkpoint_shards s"
            " USING (job_id, step, run_attempt) WHERE job_id = 'nan-pl' ORDER BY step",
            lambda rows: len(rows) == 3,
        )
        assert rows == [
            (2, True, False, None),
            (4, True, True, {"loss": "nan"}),
            (6, True, True, {"loss": "nan"}),
        ], done.stderr[-3000:]


# The loss is logged once per epoch (a mean: Lightning's on_epoch aggregation), so at a save in
# the middle of an epoch the logged value is the previous epoch's; training turns NaN at step 10.
_EPOCH_SCRIPT = """
import math, sys, torch, lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from trainer_client.integrations.lightning import CheckpointReporting

class Model(pl.LightningModule):
    def __init__(self): super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        loss = self.layer(batch).pow(2).mean()
        loss = loss * math.nan if self.global_step >= 10 else loss
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)

reporting = CheckpointReporting(spool_dir=sys.argv[2], loss_metric="train_loss")
trainer = pl.Trainer(
    max_steps=20, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=4, save_top_k=-1),
               reporting],
    plugins=[reporting.checkpoint_io],
)
trainer.fit(Model(), torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=4))
"""


def test_a_stale_epoch_loss_is_not_reported_for_a_checkpoint_trained_on_nan(
    pipeline_factory: PipelineFactory, tmp_path: Path
) -> None:
    """Issue 40: the logged metric says the previous epoch's mean at a mid-epoch save; steps
    10 and 11 were NaN, so checkpoint 12 (and every later one) is recorded as non-finite."""
    with pipeline_factory() as pipeline:
        done = run_child(
            _EPOCH_SCRIPT,
            str(tmp_path / "out"),
            str(tmp_path / "spool"),
            timeout=600,
            **pipeline.client_env(),
            CKPT_JOB_ID="nan-pl-epoch",
            WORLD_SIZE="1",
            RANK="0",
        )
        assert done.returncode == 0, done.stderr[-4000:]
        warnings = [line for line in done.stderr.splitlines() if "not finite" in line]
        assert [w.split("(step ")[1].split(")")[0] for w in warnings] == ["12", "16", "20"], (
            done.stderr[-3000:]
        )
        rows = rows_until(
            pipeline.database_url,
            "SELECT c.step, c.is_complete, s.loss, s.extra->'non_finite'"
            " FROM training_checkpoints c JOIN training_checkpoint_shards s"
            " USING (job_id, step, run_attempt) WHERE job_id = 'nan-pl-epoch' ORDER BY step",
            lambda rows: len(rows) == 5,
        )
        assert [(r[0], r[1], r[3]) for r in rows] == [
            (4, True, None),
            (8, True, None),
            (12, True, {"loss": "nan"}),
            (16, True, {"loss": "nan"}),
            (20, True, {"loss": "nan"}),
        ], done.stderr[-3000:]
        # No finite loss for a checkpoint trained on NaN (12 and 16 would carry epoch 0's mean).
        assert [r[2] is None for r in rows[2:]] == [True, True, True]
