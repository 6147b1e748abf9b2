"""Which kind of message a body is, told without parsing it: the schema names of the messages
other than a ``ckpt.v1`` report, and their sniffers. Light on purpose (no pydantic model): the
client and the writer import it at start, the restart record's model only when one is built or
read (``ckpt_contract/restart.py``: ~10 ms of a client's import)."""

from __future__ import annotations

from typing import Final

RESTART_SCHEMA: Final = "ckpt.restart.v1"
# Encoded here, a message's first key is "schema": its name sits in the body's first characters.
SNIFF_CHARS: Final = 64


def is_restart_body(body: str) -> bool:
    """Whether ``body`` names the restart record's schema near its start."""
    return RESTART_SCHEMA in body[:SNIFF_CHARS]
