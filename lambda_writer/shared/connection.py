"""The one place that opens a database connection for the writer, the migrator and the CLI.

Every connection is proxy-safe: no startup ``options`` (RDS Proxy rejects them), no server-side
prepared statements, no session state
(https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-pinning.html).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import psycopg
from psycopg import conninfo

from lambda_writer.shared.aws import WRITER_BUDGET, ClientBudget, client, rds_auth_token
from lambda_writer.shared.exceptions import SettingsError, TransientWriteError
from lambda_writer.shared.settings import WriterSettings

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
Connection = psycopg.Connection[tuple[Any, ...]]

# Patterns, not compiled ones: redact() runs on error paths only, so re compiles them (and caches
# them) there; compiled at import they cost the writer's cold start ~0.8 ms (BENCHMARKS.md §5).
_URL_PASSWORD = r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?=@)"
_KV_PASSWORD = r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)"
_QUERY_PASSWORD = r"(?P<head>[?&]password=)(?P<pw>[^&\s]*)"


def redact(text: str) -> str:
    """``text`` with every DSN password (URL, ``key=value`` or query form) replaced by ``***``."""
    for pattern in (_URL_PASSWORD, _KV_PASSWORD, _QUERY_PASSWORD):
        text = re.sub(pattern, lambda m: m.group("head") + "***", text, flags=re.I)
    return text


def describe_target(settings: WriterSettings) -> str:
    """A log-safe description of the connection target (host, port, database, user, auth)."""
    if settings.database_url is not None:
        try:
            params = conninfo.conninfo_to_dict(settings.database_url)
        except psycopg.ProgrammingError:
            return "DATABASE_URL (unparsable)"
        params.pop("password", None)
        return "DATABASE_URL " + conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    return (
        f"host={settings.db_host} port={settings.db_port} dbname={settings.db_name} "
        f"user={settings.db_user} auth={settings.db_auth} tls={settings.db_tls}"
    )


def connect_url(url: str, *, autocommit: bool = False) -> Connection:
    """Open a connection from a URL/DSN that never pins an RDS Proxy client.

    ``prepare_threshold=None`` keeps psycopg from preparing statements server-side (and from its
    ``DEALLOCATE ALL`` after a rollback): both pin a proxied connection.
    """
    return psycopg.connect(
        url, autocommit=autocommit, prepare_threshold=None, connect_timeout=CONNECT_TIMEOUT_S
    )


def connect(
    settings: WriterSettings, *, autocommit: bool = False, budget: ClientBudget = WRITER_BUDGET
) -> Connection:
    """Open a connection as ``settings`` say: DATABASE_URL, else DB_HOST with IAM or a secret.

    ``budget`` bounds the AWS call made for the credentials (the secret read).
    """
    if settings.database_url is not None:
        return connect_url(settings.database_url, autocommit=autocommit)
    password: str | None
    host, port, dbname, user = (
        settings.db_host,
        settings.db_port,
        settings.db_name,
        settings.db_user,
    )
    if settings.db_auth == "iam":
        password = _iam_token(settings, budget)
    else:
        secret = _read_secret(settings, budget)
        host = host or _str(secret.get("host"))
        port = settings.db_port if settings.db_host else int(secret.get("port") or port)
        dbname = dbname or _str(secret.get("dbname"))
        user = user or _str(secret.get("username"))
        password = _str(secret.get("password"))
    tls: dict[str, Any] = (
        {"sslmode": "verify-full", "sslrootcert": str(settings.db_ssl_root_cert)}
        if settings.db_tls == "verify-full"
        # libpq then refuses any login that is not SCRAM-SHA-256-PLUS over TLS (settings.DbTls).
        # No sslrootcert: with one, libpq's "require" verifies the chain like verify-ca.
        else {"sslmode": "require", "channel_binding": "require"}
    )
    # Passed as keyword arguments, never formatted into a DSN string that could be logged.
    return psycopg.connect(
        host=host,
        port=port,
        dbname=dbname,
        user=user,
        password=password,
        **tls,
        autocommit=autocommit,
        prepare_threshold=None,
        connect_timeout=CONNECT_TIMEOUT_S,
        application_name="ckpt-writer",
    )


def _iam_token(settings: WriterSettings, budget: ClientBudget) -> str:
    # A token is valid for 15 minutes and only checked at connect, so one is made per connect
    # (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/UsingWithRDS.IAMDBAuth.Connecting.html).
    # Signing is local (no request is sent). rds_auth_token skips the RDS client (~65-125 ms of a
    # cold start's first batch, bench.cold_start); it reads two attributes botocore's own
    # generate_db_auth_token takes from its client, so a runtime botocore that moved them falls
    # back to the client rather than failing every connect.
    from botocore.exceptions import BotoCoreError, ClientError

    host, user, region = settings.db_host, settings.db_user, settings.aws_region
    assert host is not None and user is not None and region is not None  # WriterSettings checks
    try:
        try:
            return rds_auth_token(host=host, port=settings.db_port, user=user, region=region)
        except (AttributeError, TypeError):
            logger.warning("clientless IAM token failed; using an RDS client", exc_info=True)
        rds = client("rds", region=region, budget=budget)
        token: str = rds.generate_db_auth_token(
            DBHostname=host, Port=settings.db_port, DBUsername=user
        )
    except (BotoCoreError, ClientError) as exc:
        raise TransientWriteError(f"cannot make an IAM auth token: {exc}") from exc
    return token


def _read_secret(settings: WriterSettings, budget: ClientBudget) -> dict[str, Any]:
    # Read per connect: connects are rare (once per execution environment, plus reconnects), and
    # a rotated password is then picked up by the next reconnect.
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        secrets = client("secretsmanager", region=settings.aws_region, budget=budget)
        value = secrets.get_secret_value(SecretId=settings.db_secret_arn)
    except (BotoCoreError, ClientError) as exc:
        raise TransientWriteError(f"cannot read DB_SECRET_ARN: {exc}") from exc
    try:
        secret = json.loads(value["SecretString"])
    except (KeyError, ValueError):
        secret = None
    if not isinstance(secret, dict):
        raise SettingsError("DB_SECRET_ARN", "must name a JSON object secret (username, password)")
    return secret


def _str(value: object) -> str | None:
    return None if value is None else str(value)


class ConnectionHolder:
    """The execution environment's one connection: opened lazily, reused, re-opened when broken."""

    def __init__(self, settings: WriterSettings, *, autocommit: bool = True) -> None:
        # Autocommit: the writer's batch is one statement, i.e. its own transaction (no BEGIN
        # and COMMIT round trips, and no transaction left open if the Lambda is frozen).
        self._settings = settings
        self._autocommit = autocommit
        self._conn: Connection | None = None

    @property
    def is_open(self) -> bool:
        """Whether a connection that still looks usable is held."""
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def get(self) -> tuple[Connection, bool]:
        """The held connection (opening one if needed) and whether it was reused from before."""
        if self.is_open:
            assert self._conn is not None
            return self._conn, True
        self.discard()
        logger.info("connecting to %s", describe_target(self._settings))
        self._conn = connect(self._settings, autocommit=self._autocommit)
        return self._conn, False

    def discard(self) -> None:
        """Close and forget the held connection (after a failure); the next get() reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg.Error:
                logger.debug("closing a failed connection raised", exc_info=True)
