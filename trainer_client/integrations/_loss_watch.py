"""Whether a checkpoint was trained on a non-finite loss, whatever the logged loss says.

Why the logged loss is not enough. The Hugging Face ``Trainer`` with
``logging_nan_inf_filter=True`` (its default) adds, for a step whose loss is NaN or infinite, the
average of the window's earlier steps in place of its loss (``Trainer._inner_training_loop``), so
a window of NaN steps logs ``loss: 0.0``, a finite value the model never had, which would then
rank best. Lightning's logged metric is what the module chose to log, when it chose to: one
logged ``on_epoch`` only still holds the previous epoch's mean at a save in the middle of the
next one. So :class:`LossWatch` observes each training step's own loss and keeps two flags on
its device (any NaN, any infinity), with no synchronisation per step: the flags are read where
the framework synchronises anyway (the ``Trainer``'s logging, a save).

Where the loss comes from. Lightning hands ``on_train_batch_end`` the step's outputs (its
``loss``). A ``Trainer`` callback is handed no loss, so the watch wraps the one ``Trainer``'s
``training_step`` (an instance attribute, removed at the end, as the Lightning callback wraps
``save_checkpoint``); the ``Trainer`` is found from the callback's ``on_train_begin``, which its
``_inner_training_loop`` calls through its ``CallbackHandler`` (the callback API hands callbacks
the model, never the ``Trainer``): :func:`find_trainer` searches the calling frames for the
``Trainer`` whose handler holds the callback. Not found (a ``Trainer`` that calls its callbacks
otherwise): one warning, and the logged loss alone decides, as before.

What a checkpoint is marked with (:meth:`LossWatch.saved`): a non-finite loss at any step since
the previous save. With the ``Trainer``, the flags of each logged window are agreed across
processes when it logs (an all-reduce where it gathers the loss anyway), so that every process
marks the checkpoint as the gathered loss would have; the steps not yet logged, and Lightning's
steps, as this process saw them (a NaN loss reaches every replica's weights at the next
gradient all-reduce, so the processes agree from the next step on).
"""

from __future__ import annotations

import sys
from typing import Any

# Frames between the callback's on_train_begin and the Trainer's loop: CallbackHandler's
# call_event and on_train_begin, then _inner_training_loop; a margin for wrappers.
_FRAMES = 8


def find_trainer(callback: Any) -> Any:
    """The ``transformers.Trainer`` whose callbacks hold ``callback``, from the calling frames
    (called in ``on_train_begin``), or None."""
    from transformers import Trainer

    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        frame_ = frame.f_back
        if frame_ is None:
            return None
        frame = frame_
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if isinstance(owner, Trainer) and callback in getattr(handler, "callbacks", ()):
            return owner
    return None


class LossWatch:
    """Flags of the non-finite training losses of one ``Trainer`` (see the module)."""

    def __init__(self) -> None:
        self._trainer: Any = None
        self._pending: Any = None  # [nan, inf] since the last log, as this process saw them
        self._logged = [False, False]  # the logged windows since the last save, all processes

    def attach(self, trainer: Any) -> None:
        """Wrap ``trainer.training_step`` to observe every step's loss (once: a ``train()``
        that raised never detached, so a second one must not wrap the wrapper)."""
        trainer.__dict__.pop("training_step", None)
        original = trainer.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = original(*args, **kwargs)
            self.observe(loss)
            return loss

        trainer.training_step = training_step
        self._trainer = trainer

    def detach(self) -> None:
        """Give the ``Trainer`` its own ``training_step`` back."""
        if self._trainer is not None:
            self._trainer.__dict__.pop("training_step", None)
            self._trainer = None

    def observe(self, loss: Any) -> None:
        """One step's loss (a tensor): two element-wise ops on its device, no synchronisation."""
        import torch

        if not isinstance(loss, torch.Tensor):
            return
        flags = torch.stack([loss.detach().isnan().any(), loss.detach().isinf().any()])
        self._pending = flags if self._pending is None else self._pending | flags

    def logged(self) -> None:
        """The ``Trainer`` logged the loss of the steps so far (``on_log``, every process): agree
        on whether any process had a non-finite one among them."""
        flags = self._take_pending()
        if flags is None:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            as_int = flags.to(dtype=_int_dtype())
            dist.all_reduce(as_int, op=dist.ReduceOp.MAX)
            flags = as_int.bool()
        nan, inf = (bool(x) for x in flags.tolist())
        self._logged = [self._logged[0] or nan, self._logged[1] or inf]

    def saved(self) -> str | None:
        """At a save: ``"nan"``/``"inf"`` when a step since the previous save had such a loss
        (or None); the flags start again."""
        pending = self._take_pending()
        nan, inf = self._logged
        if pending is not None:
            p_nan, p_inf = (bool(x) for x in pending.tolist())
            nan, inf = nan or p_nan, inf or p_inf
        self._logged = [False, False]
        return "nan" if nan else "inf" if inf else None

    def _take_pending(self) -> Any:
        pending, self._pending = self._pending, None
        return pending


def _int_dtype() -> Any:
    import torch

    # all_reduce(MAX) of bool is not supported by every backend (gloo); of int32 it is.
    return torch.int32
