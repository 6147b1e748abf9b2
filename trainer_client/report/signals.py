"""SIGTERM: flush within a deadline on a normal thread, then chain to the previous handler."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_log = logging.getLogger(__name__)

PreviousHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SigtermChain:
    """Installed from the main thread; the first SIGTERM asks for a flush, the next one chains.

    The handler runs in the main thread between bytecodes, possibly while the training loop
    holds a lock, so it only sets a flag and calls ``wake`` (one write(2) to a self-pipe). The
    reporter's flush thread sends SIGTERM again when done (or at the deadline); that second
    SIGTERM, like any further one from outside, restores and runs the previous handler.
    """

    def __init__(self, on_first: Callable[[], None]) -> None:
        self._on_first = on_first
        self._requested = False
        self._active = False
        self.previous: PreviousHandler = None

    @property
    def requested(self) -> bool:
        """Whether a SIGTERM arrived."""
        return self._requested

    def install(self) -> bool:
        """Install the handler; only possible from the main thread (returns False elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handle)
        self._active = True
        return True

    def uninstall(self) -> None:
        """Put the previous handler back if ours is still the installed one (main thread only)."""
        self._active = False
        if threading.current_thread() is not threading.main_thread():
            return  # the handler stays, inactive: it passes SIGTERM straight to the previous one
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, _restorable(self.previous))

    def resend(self) -> None:
        """Deliver SIGTERM to this process again, so the main thread chains."""
        os.kill(os.getpid(), signal.SIGTERM)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active and not self._requested:
            self._requested = True
            self._on_first()
            return
        self._chain(signum, frame)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous
        self._active = False
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, _restorable(previous))
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:
            # SIG_DFL (or a handler installed outside Python): die of SIGTERM as if we never
            # caught it, so the exit status still says "terminated by SIGTERM".
            os.kill(os.getpid(), signal.SIGTERM)


def _restorable(handler: PreviousHandler) -> Any:
    return signal.SIG_DFL if handler is None else handler
