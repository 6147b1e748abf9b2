"""Which rank wrote which file of a sharded checkpoint, and what a rank needs before reporting:
the file names are those the frameworks wrote on this machine (2 ranks)."""

from __future__ import annotations

import pytest

from trainer_client.exceptions import LayoutError
from trainer_client.storage.layouts import (
    deepspeed_config_refusal,
    missing_files,
    own_files,
)

# Lightning ModelParallelStrategy / FSDPStrategy(state_dict_type="sharded"): step=4.ckpt/
LIGHTNING_DCP = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
# DeepSpeed ZeRO 1/2 through Lightning: step=4.ckpt/ with tag "checkpoint"
DEEPSPEED_ZERO2 = [
    "checkpoint/mp_rank_00_model_states.pt",
    "checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    "latest",
    "zero_to_fp32.py",
    "zero_to_torch.py",
]
# DeepSpeed ZeRO 3 through the Hugging Face Trainer: checkpoint-4/
HF_ZERO3 = [
    "config.json",
    "generation_config.json",
    "global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt",
    "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt",
    "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    "latest",
    "rng_state_0.pth",
    "rng_state_1.pth",
    "trainer_state.json",
    "training_args.bin",
    "zero_to_fp32.py",
    "zero_to_torch.py",
]


@pytest.mark.parametrize("files", [LIGHTNING_DCP, DEEPSPEED_ZERO2], ids=["dcp", "deepspeed"])
def test_every_file_has_exactly_one_owner(files: list[str]) -> None:
    owners = [own_files(files, rank=r, saves_shared=r == 0) for r in (0, 1)]
    assert sorted(owners[0] + owners[1]) == sorted(files)
    assert not set(owners[0]) & set(owners[1])


def test_dcp_shards_by_rank_and_the_commit_marker_by_the_coordinator() -> None:
    assert own_files(LIGHTNING_DCP, rank=1, saves_shared=False) == ["__1_0.distcp"]
    assert own_files(LIGHTNING_DCP, rank=0, saves_shared=True) == [
        ".metadata",
        "__0_0.distcp",
        "meta.pt",
    ]
    assert missing_files(LIGHTNING_DCP, rank=0) == []
    assert missing_files(LIGHTNING_DCP, rank=1) == []


def test_every_shard_without_metadata_keeps_rank_0_from_reporting() -> None:
    uncommitted = ["__0_0.distcp", "__1_0.distcp"]
    assert missing_files(uncommitted, rank=0) == [".metadata"]
    # rank 1 has what it wrote; the checkpoint still lacks rank 0's report, so never completes
    assert missing_files(uncommitted, rank=1) == []
    assert missing_files([".metadata", "__0_0.distcp"], rank=1) == ["__1_*.distcp"]


def test_deepspeed_zero_files_by_data_parallel_rank_latest_by_rank_0() -> None:
    assert own_files(DEEPSPEED_ZERO2, rank=1, saves_shared=False) == [
        "checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    ]
    assert missing_files(DEEPSPEED_ZERO2, rank=0) == []
    assert missing_files([f for f in DEEPSPEED_ZERO2 if f != "latest"], rank=0) == ["latest"]
    no_rank_1 = [f for f in DEEPSPEED_ZERO2 if "rank_1" not in f]
    assert missing_files(no_rank_1, rank=1) == [
        "checkpoint/*zero_pp_rank_1_mp_rank_00_optim_states.pt"
    ]


def test_hf_zero3_rank_files_inside_checkpoint_n() -> None:
    # saves_shared=False: HF's other processes own only files that carry their index
    mine = own_files(HF_ZERO3, rank=1, saves_shared=False)
    assert mine == [
        "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt",
        "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert missing_files(HF_ZERO3, rank=1) == []
    lost = [f for f in HF_ZERO3 if f != "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"]
    assert missing_files(lost, rank=1) == [
        "global_step4/*zero_pp_rank_1_mp_rank_00_model_states.pt"
    ]


def test_bf16_zero_files_belong_to_their_rank() -> None:
    files = ["t/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "t/mp_rank_00_model_states.pt"]
    assert own_files(files, rank=1, saves_shared=False) == [files[0]]
    assert own_files(files, rank=0, saves_shared=True) == [files[1]]


def test_model_parallel_deepspeed_files_are_refused_not_guessed() -> None:
    with pytest.raises(LayoutError, match="mp_rank_01"):
        own_files(["t/zero_pp_rank_0_mp_rank_01_optim_states.pt"], rank=0, saves_shared=True)
    with pytest.raises(LayoutError, match="mp_rank_01"):
        own_files(["t/mp_rank_01_model_states.pt"], rank=0, saves_shared=True)


@pytest.mark.parametrize(
    ("config", "engine"),
    [
        ({"checkpoint": {"writer": {"type": "fast"}}}, "checkpoint.writer"),
        ({"datastates_ckpt": {"host_cache_size": 16}}, "datastates_ckpt"),
        ({"nebula": {"enabled": True}}, "nebula"),
    ],
)
def test_deepspeed_engines_that_write_after_save_returns_are_refused(
    config: dict[str, object], engine: str
) -> None:
    reason = deepspeed_config_refusal(config)
    assert reason is not None and engine in reason


def test_deepspeed_default_engine_is_accepted() -> None:
    assert deepspeed_config_refusal({"zero_optimization": {"stage": 3}}) is None
    assert (
        deepspeed_config_refusal({"nebula": {"enabled": False}, "datastates_ckpt": False}) is None
    )
