"""A PostgreSQL database for local runs: ``DATABASE_URL``, the machine's server, or a throwaway one.

The throwaway cluster is built from the machine's PostgreSQL binaries (``initdb`` + ``pg_ctl``) in a
temporary directory on a free loopback port, and removed afterwards. ``initdb`` and ``postgres``
refuse to run as root, so as root they run as the ``postgres`` user through ``runuser``.

What pytest-postgresql does instead: the test suite's throwaway databases come from its
``DatabaseJanitor`` (``tests/conftest.py``). This module stays for the runtime path (the demo, its
compare mode, the benchmarks), which must work without pytest: pytest-postgresql depends on
pytest, and its process factory (10.0) runs ``pg_ctl initdb`` as the current user, which fails as
root ("cannot be run as root") -- the way CI and this machine run. The clusters with a low
``max_connections`` are the compare mode's, so they are this module's too.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psycopg
from psycopg import sql

from ckpt_pipeline.exceptions import EmbeddedPostgresError
from ckpt_pipeline.local.ports import free_loopback_port
from ckpt_pipeline.settings import DATABASE_URL_VAR, Settings

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
_PROBE_TIMEOUT_S = 2
_START_TIMEOUT_S = 60

DatabaseKind = Literal["env", "local-server", "throwaway"]


@dataclass(frozen=True)
class ProvidedDatabase:
    """The database to use, and a superuser URL on the same server (None for DATABASE_URL)."""

    url: str
    kind: DatabaseKind
    admin_url: str | None = None


@dataclass(frozen=True)
class ThrowawayCluster:
    """A running temporary PostgreSQL cluster on 127.0.0.1 with trust authentication."""

    port: int
    data_dir: Path
    max_connections: int

    @property
    def admin_url(self) -> str:
        """The superuser on the ``postgres`` database."""
        return self.url_for("postgres")

    def url_for(self, dbname: str, *, user: str = SUPERUSER) -> str:
        """A URL for ``dbname`` as ``user`` (trust auth: no password)."""
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=str(self.port), user=user, dbname=dbname
        )

    def create_database(self, name: str) -> str:
        """Create ``name`` on this cluster; returns its superuser URL."""
        return create_database(self.admin_url, name)


def find_postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl, else PATH's."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1,
        reverse=True,
    )
    for bin_dir in candidates:
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file():
            return bin_dir
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def _as_postgres_user(argv: Sequence[str]) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError as exc:
        raise EmbeddedPostgresError(
            f"running as root needs a '{SUPERUSER}' user to run PostgreSQL as;"
            f" set {DATABASE_URL_VAR} instead"
        ) from exc
    return ["runuser", "-u", SUPERUSER, "--", *argv]


def _run(argv: Sequence[str], *, what: str, log_file: Path | None = None) -> None:
    result = subprocess.run(
        _as_postgres_user(argv),
        capture_output=True,
        text=True,
        timeout=_START_TIMEOUT_S,
        check=False,
        env={**os.environ, "LC_ALL": "C"},
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        if log_file is not None and log_file.exists():
            detail += "\n" + log_file.read_text(errors="replace")[-2000:]
        raise EmbeddedPostgresError(f"{what} failed (exit {result.returncode}): {detail}")


@contextmanager
def start_throwaway_cluster(
    *,
    max_connections: int = 100,
    port: int | None = None,
    bin_dir: Path | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[ThrowawayCluster]:
    """Run a temporary cluster for the block (``max_connections`` as given); removed afterwards.

    ``settings`` are extra server parameters (``-c name=value``), e.g. ``{"statement_timeout":
    "5s"}`` for a server-wide default.
    """
    if max_connections < 1:
        raise ValueError("max_connections must be at least 1")
    bin_dir = bin_dir or find_postgres_bin_dir()
    if bin_dir is None:
        raise EmbeddedPostgresError(
            "no PostgreSQL binaries found (initdb, pg_ctl in /usr/lib/postgresql/*/bin or PATH);"
            f" set {DATABASE_URL_VAR} to a database to use"
        )
    root = Path(tempfile.mkdtemp(prefix="ckpt-pg-"))
    data_dir = root / "data"
    log_file = root / "postgres.log"
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SUPERUSER)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    port = port or free_loopback_port()
    options = {
        "port": str(port),
        "listen_addresses": "127.0.0.1",
        "max_connections": str(max_connections),
        # Our own socket directory: the system one may belong to another server or be absent.
        "unix_socket_directories": str(root),
        "fsync": "off",  # a throwaway cluster; durability would only slow the demo down
        **(settings or {}),
    }
    started = False
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ],
            what="initdb",
        )
        option_text = " ".join(f"-c {name}={value}" for name, value in options.items())
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "-D",
                str(data_dir),
                "-l",
                str(log_file),
                "-o",
                option_text,
            ],
            what="pg_ctl start",
            log_file=log_file,
        )
        started = True
        logger.info(
            "throwaway PostgreSQL on 127.0.0.1:%d, max_connections=%d", port, max_connections
        )
        yield ThrowawayCluster(port=port, data_dir=data_dir, max_connections=max_connections)
    finally:
        if started:
            try:
                _run(
                    [str(bin_dir / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(data_dir)],
                    what="pg_ctl stop",
                )
            except EmbeddedPostgresError:
                logger.exception("could not stop the throwaway PostgreSQL in %s", root)
        shutil.rmtree(root, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` through ``admin_url``; returns the same server's URL for it."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(admin_url, dbname=name)


@contextmanager
def throwaway_database(admin_url: str, *, prefix: str) -> Iterator[str]:
    """A new database ``<prefix><random>`` on ``admin_url``'s server for the block; its URL."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    url = create_database(admin_url, name)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting anyone still on it."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_login_role(
    admin_url: str,
    database_url: str,
    role: str,
    *,
    statement_timeout: str | None = None,
    connection_limit: int | None = None,
) -> str:
    """Create (or alter) a login role with read/write on the public tables; returns its URL.

    Timeouts are role settings, as the writer's are (no ``options`` startup parameter).
    """
    ident = sql.Identifier(role)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        if statement_timeout is not None:
            admin.execute(
                sql.SQL("ALTER ROLE {} SET statement_timeout = {}").format(
                    ident, sql.Literal(statement_timeout)
                )
            )
        if connection_limit is not None:
            admin.execute(
                sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                    ident, sql.Literal(connection_limit)
                )
            )
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
        db.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
            ).format(ident)
        )
        # The writer's batch function (migration 0003) and procedure (0006) are not executable
        # by PUBLIC; ALL ROUTINES covers procedures, ALL FUNCTIONS does not.
        db.execute(sql.SQL("GRANT EXECUTE ON ALL ROUTINES IN SCHEMA public TO {}").format(ident))
    return psycopg.conninfo.make_conninfo(database_url, user=role, password=None)


def server_reachable(url: str) -> bool:
    """Whether a connection to ``url`` succeeds within a short timeout."""
    try:
        with psycopg.connect(url, connect_timeout=_PROBE_TIMEOUT_S):
            return True
    except psycopg.OperationalError:
        return False


@contextmanager
def database_url_or_embedded(
    *,
    settings: Settings | None = None,
    max_connections: int = 100,
    dbname_prefix: str = "ckpt_demo_",
) -> Iterator[ProvidedDatabase]:
    """``DATABASE_URL`` if set; else a throwaway database on the machine's server; else a cluster.

    The throwaway database (or cluster) is dropped when the block ends. Migrations are the
    caller's step (``lambda_writer.migrate.apply.apply_migrations``).
    """
    settings = settings or Settings.from_env()
    if settings.database_url:
        yield ProvidedDatabase(url=settings.database_url, kind="env")
        return
    if server_reachable(settings.local_admin_url):
        with throwaway_database(settings.local_admin_url, prefix=dbname_prefix) as url:
            logger.info("using a throwaway database on the local server")
            yield ProvidedDatabase(url=url, kind="local-server", admin_url=settings.local_admin_url)
        return
    name = f"{dbname_prefix}{uuid.uuid4().hex[:10]}"
    with start_throwaway_cluster(max_connections=max_connections) as cluster:
        yield ProvidedDatabase(
            url=cluster.create_database(name), kind="throwaway", admin_url=cluster.admin_url
        )
