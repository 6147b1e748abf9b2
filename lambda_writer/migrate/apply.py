"""Versioned schema migrations: plain SQL files applied in order, recorded, under an advisory lock.

Run by the operator CLI (``ckpt-pipeline migrate``) and by the deployment's migration trigger,
never by the writer's hot path.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

# Re-exported: the class lives with the writer's other errors (one root, WriterError).
from lambda_writer.migrate.exceptions import MigrationError

__all__ = ["MigrationError"]

logger = logging.getLogger(__name__)

MIGRATIONS_PACKAGE = "lambda_writer.migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any fixed 64-bit key shared by every migrator of this schema.
_LOCK_KEY = 0x636B70745F6D6967  # "ckpt_mig"


@dataclass(frozen=True)
class Migration:
    """One SQL file: ``NNNN_description.sql``."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The migrations shipped with the package, ordered by version."""
    found = []
    for entry in resources.files(MIGRATIONS_PACKAGE).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _NAME.match(entry.name)
        if match is None:
            raise MigrationError(f"{entry.name}: migration files must be named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {[m.name for m in found]}")
    return found


def apply_migrations(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply every pending migration in one transaction; returns the names applied.

    The transaction-scoped advisory lock makes concurrent migrators queue: the second one sees the
    first one's rows and applies nothing. DDL is transactional in PostgreSQL, so a failure leaves
    the schema as it was. A collision with another database's migrator on the cluster-wide role
    rows is retried (see ``_SHARED_CATALOG_ATTEMPTS``).
    """
    migrations = load_migrations()
    for attempt in range(1, _SHARED_CATALOG_ATTEMPTS + 1):
        try:
            return _apply_once(conn, migrations)
        except (psycopg.errors.InternalError_, psycopg.errors.UniqueViolation) as exc:
            if attempt == _SHARED_CATALOG_ATTEMPTS or not _lost_shared_catalog_race(exc):
                raise
            # Rolled back; the other database's migrator has committed or will soon.
            logger.warning("a migrator of another database changed ckpt_writer at once; retrying")
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


# Roles and their settings are cluster-wide catalogs, which the advisory lock (per database) does
# not cover: two databases of one cluster migrating at once (two stacks on one instance, or two
# test runs) can collide on ckpt_writer's rows. The loser's transaction is rolled back whole, so
# applying it again is safe, and the second time it sees the winner's rows.
_SHARED_CATALOG_ATTEMPTS = 5
_SHARED_CATALOG_CONSTRAINTS = frozenset(
    {"pg_authid_rolname_index", "pg_db_role_setting_databaseid_rol_index"}
)


def _lost_shared_catalog_race(exc: psycopg.Error) -> bool:
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return exc.diag.constraint_name in _SHARED_CATALOG_CONSTRAINTS or any(
            name in str(exc) for name in _SHARED_CATALOG_CONSTRAINTS
        )
    return "tuple concurrently updated" in str(exc)


def _apply_once(conn: psycopg.Connection[Any], migrations: list[Migration]) -> list[str]:
    applied_now: list[str] = []
    # What was being applied when the server refused a privilege (named in the error).
    step = "schema_migrations (the migrations' own table)"
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute(
                """
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version    integer     PRIMARY KEY,
                    name       text        NOT NULL,
                    checksum   text        NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """
            )
            cur.execute("SELECT version, name, checksum FROM schema_migrations")
            recorded = {int(v): (str(n), str(c)) for v, n, c in cur.fetchall()}
            for migration in migrations:
                if migration.version in recorded:
                    name, checksum = recorded[migration.version]
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"{migration.name}: already applied as {name} with a different"
                            " checksum; never edit an applied migration, add a new one"
                        )
                    continue
                logger.info("applying migration %s", migration.name)
                step = migration.name
                cur.execute(migration.sql.encode())
                cur.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
                applied_now.append(migration.name)
    except psycopg.errors.InsufficientPrivilege as exc:
        # Rolled back by now, so the connection can ask the server what this role lacks.
        raise MigrationError(f"{step}: {_missing_privilege(conn, step, exc)}") from exc
    return applied_now


def _missing_privilege(
    conn: psycopg.Connection[Any], step: str, exc: psycopg.errors.InsufficientPrivilege
) -> str:
    """The server's refusal, with the privilege the migration needs and the role lacks.

    PostgreSQL says only "permission denied" for some statements (ALTER ROLE … SET), so the
    role's actual privileges are read rather than parsed from the message.
    """
    refused = (exc.diag.message_primary or str(exc)).strip()
    row = conn.execute(
        "SELECT current_user, r.rolsuper, r.rolcreaterole,"
        " has_schema_privilege('public', 'CREATE')"
        " FROM pg_roles r WHERE r.rolname = current_user"
    ).fetchone()
    if row is None:
        return refused
    user, superuser, createrole, create_on_public = row
    missing = []
    if not (superuser or create_on_public):
        missing.append("CREATE on schema public")
    sql = next((m.sql for m in load_migrations() if m.name == step), "")
    if not (superuser or createrole) and re.search(r"\b(CREATE|ALTER)\s+ROLE\b", sql, re.I):
        missing.append("CREATEROLE")
    if not missing:
        return f"{refused} (as role {user})"
    return f"{refused}: role {user} lacks {' and '.join(missing)}"
