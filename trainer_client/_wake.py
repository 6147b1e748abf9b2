"""A self-pipe wake-up: safe to trigger from a signal handler (one write(2), no Python locks)."""

from __future__ import annotations

import contextlib
import os
import select


class Waker:
    """Lets any thread, or a signal handler, wake a thread blocked in :meth:`wait`."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def wake(self) -> None:
        """Wake the waiter; async-signal-safe (a full pipe means a wake-up is already pending)."""
        if self._closed:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._w, b"\0")

    def wait(self, timeout: float | None) -> None:
        """Block until woken or ``timeout`` seconds pass; consumes pending wake-ups."""
        if self._closed:
            return
        readable, _, _ = select.select([self._r], [], [], timeout)
        if readable:
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(self._r, 4096):
                    pass

    def close(self) -> None:
        """Release the pipe."""
        if not self._closed:
            self._closed = True
            os.close(self._r)
            os.close(self._w)
