"""torchrun's side of a local launch, in a module that imports nothing heavy (the integrations'
launchers import it before they fork their ranks)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that was free a moment ago on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """torchrun's environment contract for one rank of a single-node launch on loopback."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
