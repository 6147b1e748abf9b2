"""Wake-ups for the sender thread: from threads (an Event) and from a signal handler (a pipe).

Threads use a ``threading.Event``: setting it never releases the GIL, so ``report()`` is not
overtaken by the sender it wakes (a pipe write would release the GIL mid-``report()`` and let
the sender run first for up to the 5 ms switch interval). A signal handler must not take the
Event's lock (the main thread may hold it when interrupted), so it writes one byte to a pipe,
and a small watcher thread turns that byte into ``wake()``.
"""

from __future__ import annotations

import contextlib
import os
import threading


class Waker:
    """Lets any thread, or a signal handler, wake a thread blocked in :meth:`wait`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, name="ckpt-signal-wake", daemon=True)
        self._watcher.start()

    def wake(self) -> None:
        """Wake the waiter (from any thread; not from a signal handler)."""
        self._event.set()

    def wake_from_signal(self) -> None:
        """Wake the waiter from a signal handler: one write(2), no Python locks."""
        if not self._closed:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._w, b"\0")

    def wait(self, timeout: float | None) -> None:
        """Block until woken or ``timeout`` seconds pass; consumes the wake-up.

        A wake-up that lands between the wait and the clear is not lost in effect: callers
        re-check their state after every wait, and the state changed before the wake-up.
        """
        self._event.wait(timeout)
        self._event.clear()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._r, 4096)
            except OSError:
                return
            if not data or self._closed:
                return
            self._event.set()

    def close(self) -> None:
        """Stop the watcher and release the pipe."""
        if not self._closed:
            self._closed = True
            os.close(self._w)  # EOF ends the watcher's read
            self._watcher.join(timeout=1.0)
            os.close(self._r)
