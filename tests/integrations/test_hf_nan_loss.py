"""Issue 32 §2: a NaN loss from step 12 loses no checkpoint, and says so where the user looks;
issue 40: the same under the Trainer's default ``logging_nan_inf_filter=True``.

One Trainer process (as a user's script: logging not configured) against the local pipeline:
the loss turns NaN at step 12; checkpoints 10, 20 and 30 must all be recorded complete, 20 and
30 with the loss absent and the fact in the shard's extra, never the best; stderr carries the
Trainer logger's warning once per checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_pipeline.cli import main
from tests.e2e.conftest import PipelineFactory
from tests.trainer_client.helpers import rows_until, run_child

pytestmark = pytest.mark.slow

_SCRIPT = """
import math, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from trainer_client.integrations.huggingface import CheckpointReporterCallback

model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1))
class Data(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        x = torch.arange(8) % 64
        return {"input_ids": x, "labels": x}

class NanFrom12(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        return loss * math.nan if self.state.global_step >= 11 else loss

args = TrainingArguments(
    output_dir=sys.argv[1], save_steps=10, max_steps=30, logging_steps=1, report_to=[],
    per_device_train_batch_size=2, use_cpu=True, logging_nan_inf_filter=sys.argv[3] == "filter",
    disable_tqdm=True, save_total_limit=5,
)
callback = CheckpointReporterCallback(spool_dir=sys.argv[2])
trainer = NanFrom12(model=model, args=args, train_dataset=Data(), callbacks=[callback])
try:
    trainer.train()
finally:
    callback.close()
print("failures", callback.failures, "reported", sorted(callback.reported_steps))
"""


@pytest.mark.parametrize("nan_filter", ["no-filter", "filter"])
def test_a_nan_loss_from_step_12_leaves_every_checkpoint_recorded(
    pipeline_factory: PipelineFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nan_filter: str,
) -> None:
    # GIVEN logging_nan_inf_filter off, or on (the Trainer's default: it logs a NaN step as the
    # window's average of the others, 0.0 here, which must not become the checkpoint's loss)
    with pipeline_factory() as pipeline:
        done = run_child(
            _SCRIPT,
            str(tmp_path / "out"),
            str(tmp_path / "spool"),
            nan_filter,
            timeout=600,
            **pipeline.client_env(),
            CKPT_JOB_ID=f"nan12-{nan_filter}",
            WORLD_SIZE="1",
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert "failures 0 reported [10, 20, 30]" in done.stdout, done.stdout + done.stderr
        # Once per checkpoint, through the Trainer's logger, with logging not configured.
        warnings = [line for line in done.stderr.splitlines() if "not finite" in line]
        assert [w.split(":")[0] for w in warnings] == [
            "[transformers] checkpoint-20",
            "[transformers] checkpoint-30",
        ], warnings
        assert "loss=nan not finite, recorded as absent" in warnings[0]
        rows = rows_until(
            pipeline.database_url,
            "SELECT c.step, c.is_complete, s.loss, s.extra->'non_finite'"
            " FROM training_checkpoints c JOIN training_checkpoint_shards s"
            f" USING (job_id, step, run_attempt) WHERE job_id = 'nan12-{nan_filter}' ORDER BY step",
            lambda rows: len(rows) == 3,
        )
        assert [(r[0], r[1], r[3]) for r in rows] == [
            (10, True, None),
            (20, True, {"loss": "nan"}),
            (30, True, {"loss": "nan"}),
        ]
        assert rows[0][2] is not None and rows[1][2] is None and rows[2][2] is None
        # AND the best by loss is step 10, never a NaN one
        capsys.readouterr()
        argv = ["checkpoints", "--job", f"nan12-{nan_filter}", "--best", "loss", "--no-check-files"]
        assert main(argv, {**os.environ, "DATABASE_URL": pipeline.database_url}) == 0
        assert "best loss (min): step 10," in capsys.readouterr().out
