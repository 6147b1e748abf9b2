"""The one place that opens a database connection for the writer, the migrator and the CLI."""

from __future__ import annotations

import psycopg

CONNECT_TIMEOUT_S = 5


def connect_url(url: str, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection that never pins an RDS Proxy client.

    ``prepare_threshold=None`` keeps psycopg from preparing statements server-side (and from its
    ``DEALLOCATE ALL`` after a rollback): both pin a proxied connection.
    """
    return psycopg.connect(
        url, autocommit=autocommit, prepare_threshold=None, connect_timeout=CONNECT_TIMEOUT_S
    )
