"""What a committed checkpoint is named (trainer_client.storage.committed): the one rule the
restart's "newer in the store" warning and ckpt-pipeline reconcile both read (pure)."""

from __future__ import annotations

import pytest

from ckpt_pipeline.ops.reconcile_layout import StoreObject, group_checkpoints
from trainer_client.restart.decide import newer_in_listing
from trainer_client.restart.lookup import ResumePoint
from trainer_client.storage.committed import committed_location, newest_committed

COMMITTED = [
    ("run/checkpoint-7/trainer_state.json", (7, "run/checkpoint-7/")),
    ("step-8/.metadata", (8, "step-8/")),
    ("global_step9/.metadata", (9, "global_step9/")),
    ("run/epoch=3-step=1200.ckpt", (1200, "run/epoch=3-step=1200.ckpt")),
    ("run/step=5.ckpt", (5, "run/step=5.ckpt")),
    ("run/step=5-v1.ckpt", (5, "run/step=5-v1.ckpt")),
]
# Another metric that ends in "step", and a step that is no number: not checkpoints, for the
# restart as for reconcile (the restart once took both).
NOT_CHECKPOINTS = [
    "run/mystep=5.ckpt",
    "run/step=5x.ckpt",
    "run/last.ckpt",
    "run/checkpoint-7/model.safetensors",
    "step-8/__0_0.distcp",
]


@pytest.mark.parametrize(("relative", "expected"), COMMITTED)
def test_a_commit_marker_names_its_checkpoint(relative: str, expected: tuple[int, str]) -> None:
    assert committed_location(relative) == expected


@pytest.mark.parametrize("relative", NOT_CHECKPOINTS)
def test_other_names_commit_nothing(relative: str) -> None:
    assert committed_location(relative) is None


def test_the_newest_committed_above_a_step() -> None:
    listing = [r for r, _ in COMMITTED] + NOT_CHECKPOINTS
    assert newest_committed(listing) == (1200, "run/epoch=3-step=1200.ckpt")
    assert newest_committed(listing, above=1200) is None
    assert newest_committed(["run/mystep=50.ckpt", "run/step=60x.ckpt"], above=5) is None


def _point(step: int) -> ResumePoint:
    return ResumePoint(
        job_id="j", step=step, epoch=0, run_attempt=0, world_size=1, uris={}, path="s3://b/x"
    )


@pytest.mark.parametrize("relative", ["mystep=50.ckpt", "step=50x.ckpt"])
def test_the_restart_sees_no_newer_checkpoint_in_names_reconcile_refuses(relative: str) -> None:
    # GIVEN a listing whose only newer name is not a Lightning checkpoint's
    # WHEN the restart looks for a newer committed checkpoint, and reconcile groups the objects
    # THEN neither takes it for one.
    assert newer_in_listing(_point(5), [relative]) is None
    objects = [StoreObject(relative=relative, uri=f"s3://b/{relative}", bytes=1, modified_s=0.0)]
    assert group_checkpoints(objects) == []


def test_the_restart_and_reconcile_agree_on_a_lightning_file() -> None:
    relative = "epoch=0-step=50.ckpt"
    assert newer_in_listing(_point(5), [relative]) == (50, relative)
    objects = [StoreObject(relative=relative, uri=f"s3://b/{relative}", bytes=1, modified_s=0.0)]
    (checkpoint,) = group_checkpoints(objects)
    assert (checkpoint.step, checkpoint.location, checkpoint.layout) == (50, relative, "lightning")
