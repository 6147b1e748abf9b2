"""The operator tooling's configuration, read once from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ckpt_pipeline.exceptions import ConfigError

DATABASE_URL_VAR = "DATABASE_URL"
QUEUE_URL_VAR = "CKPT_QUEUE_URL"
DLQ_URL_VAR = "DLQ_URL"
# The writer's event source mapping, which the circuit breaker disables while the database is
# down (the breaker function's own variable; `status` shows its state).
MAPPING_VAR = "EVENT_SOURCE_MAPPING_ID"
# The machine's own server, tried when DATABASE_URL is not set.
LOCAL_ADMIN_URL_VAR = "CKPT_LOCAL_ADMIN_URL"
DEFAULT_LOCAL_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True)
class Settings:
    """Environment the CLI commands read; every field is optional until a command needs it."""

    database_url: str | None = None
    queue_url: str | None = None
    dlq_url: str | None = None
    mapping_uuid: str | None = None
    local_admin_url: str = DEFAULT_LOCAL_ADMIN_URL
    # The whole environment read: where a command finds the settings of a part it runs (poll's
    # writer reads its own from it, as in Lambda: WriterSettings.from_env).
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the variables; empty strings count as unset."""
        source = os.environ if env is None else env
        return cls(
            database_url=source.get(DATABASE_URL_VAR) or None,
            queue_url=source.get(QUEUE_URL_VAR) or None,
            dlq_url=source.get(DLQ_URL_VAR) or None,
            mapping_uuid=source.get(MAPPING_VAR) or None,
            local_admin_url=source.get(LOCAL_ADMIN_URL_VAR) or DEFAULT_LOCAL_ADMIN_URL,
            environ=source,
        )

    def require_database_url(self) -> str:
        """DATABASE_URL, or a ConfigError naming it."""
        if not self.database_url:
            raise ConfigError(
                DATABASE_URL_VAR, "is not set; set it to postgresql://user@host:5432/dbname"
            )
        return check_database_url(self.database_url)


def check_database_url(url: str) -> str:
    """``url`` if it is a PostgreSQL URL or key=value DSN, else a ConfigError (never echoes it:
    it may hold a password)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else None
    if scheme is not None and scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            DATABASE_URL_VAR,
            f"scheme {scheme!r} is not PostgreSQL; use postgresql://user@host:5432/dbname",
        )
    if scheme is None and "=" not in url:
        raise ConfigError(
            DATABASE_URL_VAR,
            "is not a PostgreSQL URL or key=value DSN; use postgresql://user@host:5432/dbname",
        )
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ModuleNotFoundError:  # a base install: the command that connects says what is missing
        return url
    try:
        conninfo_to_dict(url)
    except ProgrammingError:
        # libpq's own message may quote the whole string, password included.
        raise ConfigError(
            DATABASE_URL_VAR,
            "libpq cannot parse it (a space or a character that must be %-escaped?);"
            " use postgresql://user@host:5432/dbname",
        ) from None
    return url


def require(value: str | None, *, option: str, variable: str) -> str:
    """An option's value or its environment fallback, or a ConfigError naming both."""
    if not value:
        raise ConfigError(variable, f"is not set and {option} was not given")
    return value
