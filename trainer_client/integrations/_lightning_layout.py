"""How a Lightning strategy writes its checkpoint, or why the reporting callback refuses it.

* ``file``: rank 0 writes one file through ``CheckpointIO`` (``Strategy.save_checkpoint`` as
  Lightning defines it: single device, DDP and its variants; ``FSDPStrategy`` with
  ``state_dict_type="full"`` and ``ModelParallelStrategy(save_distributed_checkpoint=False)``,
  whose saves gather the full state on rank 0 and call that same method).
* ``dcp``: ``FSDPStrategy`` sharded and ``ModelParallelStrategy`` (default) write a DCP
  directory (``__<rank>_0.distcp`` per rank, ``.metadata`` by rank 0) and rank 0 adds ``meta.pt``.
* ``deepspeed``: ``DeepSpeedStrategy`` calls the engine's ``save_checkpoint(path,
  tag="checkpoint")``: ZeRO files per rank in ``path/checkpoint/``, ``path/latest`` by rank 0.

Anything else that overrides ``save_checkpoint`` (XLA, a user's subclass) is refused: its files
are not known, and a wrong report would make an unloadable checkpoint look complete.
"""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.strategies import (
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    Strategy,
)

from trainer_client.exceptions import IntegrationError
from trainer_client.storage.layouts import LIGHTNING_META, deepspeed_config_refusal

SaveLayout = Literal["file", "dcp", "deepspeed"]


def _saves_as(strategy: Strategy, cls: type[Strategy]) -> bool:
    return isinstance(strategy, cls) and type(strategy).save_checkpoint is cls.save_checkpoint


def save_layout(strategy: Strategy) -> SaveLayout:
    """The layout ``strategy`` saves (see the module), or ``IntegrationError`` with the reason."""
    name = type(strategy).__name__
    if type(strategy).save_checkpoint is Strategy.save_checkpoint:
        return "file"
    if _saves_as(strategy, FSDPStrategy):
        kind = getattr(strategy, "_state_dict_type", None)
        if kind in ("full", "sharded"):
            return "file" if kind == "full" else "dcp"
        raise IntegrationError("strategy", f"{name}: unknown state_dict_type {kind!r}")
    if _saves_as(strategy, ModelParallelStrategy):
        return "dcp" if getattr(strategy, "_save_distributed_checkpoint", True) else "file"
    if _saves_as(strategy, DeepSpeedStrategy):
        config: Any = getattr(strategy, "config", None) or {}
        reason = deepspeed_config_refusal(config)
        if reason:
            raise IntegrationError("strategy", f"{name}: {reason}; not reported")
        return "deepspeed"
    raise IntegrationError(
        "strategy",
        f"{name} saves its own way (files this integration does not know); CheckpointReporting "
        "supports single-device, DDP, FSDP, ModelParallel and DeepSpeed strategies",
    )


def rank0_required(layout: SaveLayout) -> tuple[str, ...]:
    """Files rank 0 must find beyond the layout's own commit marker
    (``trainer_client.storage.layouts``)."""
    return (LIGHTNING_META,) if layout == "dcp" else ()
