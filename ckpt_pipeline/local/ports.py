"""A free loopback port for a server the local stand-in starts (one helper for all of them)."""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago: the server binds it a moment later, so a
    caller that can lose the race to another process retries with a new one (LocalStack does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
