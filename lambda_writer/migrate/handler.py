"""Deploy-time migrations: a CDK Trigger / custom-resource handler around ``apply_migrations``.

Connects with the writer's settings (the stack points them directly at the instance, as the
master user with the master secret, ``DB_TLS=channel-binding``), applies the pending migrations,
and, when ``WRITER_PASSWORD_SECRET_ARN`` (``PRUNER_PASSWORD_SECRET_ARN``) is set, sets role
``ckpt_writer``'s (``ckpt_pruner``'s) password from that
secret's ``password``. A CloudFormation custom-resource ``Delete`` is a no-op
(the schema outlives the stack's migration resource). Meant to run behind a CDK Trigger or the
custom-resource Provider framework, which send the CloudFormation response themselves.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import psycopg
from psycopg import sql

from lambda_writer.migrate.apply import apply_migrations
from lambda_writer.migrate.exceptions import ChannelBindingRefused, LoginRefused
from lambda_writer.shared.aws import MIGRATION_BUDGET, client
from lambda_writer.shared.connection import Connection, connect, describe_target, redact
from lambda_writer.shared.constants import PRUNER_DB_USER, WRITER_DB_USER
from lambda_writer.shared.exceptions import SettingsError
from lambda_writer.shared.settings import WriterSettings

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)
# botocore logs request and response bodies at DEBUG (a GetSecretValue response holds the
# password): whatever the root level, keep it above DEBUG (and its per-call INFO chatter).
logging.getLogger("botocore").setLevel(logging.WARNING)

PHYSICAL_RESOURCE_ID = "ckpt-pipeline-schema"
# libpq's words when channel_binding=require meets a server that asks for md5 or a clear-text
# password (libpq >= 13: "channel binding required but not supported by server's authentication
# request"), or that ends a login without channel binding ("channel binding required, but server
# authenticated client without channel binding"); checked against libpq in
# tests/lambda_writer/test_channel_binding.py.
_NO_CHANNEL_BINDING = "channel binding required"
# The server refused the login itself. libpq gives no SQLSTATE for a failed connection (psycopg's
# OperationalError.sqlstate is None then), so its FATAL words are matched, and the SQLSTATE when
# there is one: 28P01 invalid_password ("password authentication failed for user ..."; also what a
# SCRAM login gets when the role's password is stored as md5) and 28000
# invalid_authorization_specification (no or a rejecting pg_hba.conf line, an unknown role)
# (https://www.postgresql.org/docs/current/errcodes-appendix.html). No retry changes these.
_AUTH_SQLSTATES = frozenset({"28P01", "28000"})
_AUTH_FAILED = (
    "password authentication failed",
    "authentication failed for user",
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",
    "does not have a valid SCRAM secret",
)
# What a database that is not ready yet gives, and only that, is retried: nothing listens yet
# (refused), packets go nowhere yet (security group rules on their way: timeouts, no route), the
# name does not resolve yet, or the server is still starting up (SQLSTATE 57P03).
_NOT_READY = (
    "connection refused",
    "timeout expired",
    "timed out",
    "no route to host",
    "network is unreachable",
    "could not translate host name",
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "server closed the connection unexpectedly",
    "connection reset by peer",
)


def handler(event: dict[str, Any] | None, context: Any) -> dict[str, Any]:
    """Apply migrations (and the writer's password); returns ``{"applied": [...]}``."""
    event = event or {}
    request_type = event.get("RequestType")
    response: dict[str, Any] = {"applied": []}
    if request_type is not None:
        response["PhysicalResourceId"] = event.get("PhysicalResourceId", PHYSICAL_RESOURCE_ID)
    if request_type == "Delete":
        logger.info("custom resource Delete: nothing to do")
        return response
    settings = WriterSettings.from_env()
    logger.info("migrating %s", describe_target(settings))
    with _connect_when_ready(settings, context) as conn:
        applied = apply_migrations(conn)
        for role, password in _role_passwords(settings):
            set_role_password(conn, password, role=role)
            logger.info("password of role %s set from its secret", role)
    logger.info("applied migrations: %s", applied or "none pending")
    response["applied"] = applied
    if request_type is not None:
        response["Data"] = {"Applied": ",".join(applied)}
    return response


def _connect_when_ready(settings: WriterSettings, context: Any) -> Connection:
    """Connect, retrying while the database is not reachable yet.

    A failed migration rolls the whole deployment back, so a database that is still settling (a
    just-created instance, security group rules on their way) is retried until 30 s before the
    deadline. Anything else fails at once: a refused channel binding or login (saying what to
    check), and any other error as psycopg raised it.
    """
    delay_s = 5.0
    while True:
        try:
            return connect(settings, budget=MIGRATION_BUDGET)
        except psycopg.OperationalError as exc:
            if settings.db_tls == "channel-binding" and _NO_CHANNEL_BINDING in str(exc):
                raise ChannelBindingRefused(
                    f"{settings.db_host}:{settings.db_port} did not offer user "
                    f"{settings.db_user or '(the secret’s username)'} a SCRAM-SHA-256 login "
                    "with channel binding, which "
                    "DB_TLS=channel-binding requires: its password is most likely stored as "
                    "md5 - reset the master password with password_encryption=scram-sha-256 "
                    "(the RDS for PostgreSQL 14+ default) and deploy again; if it is SCRAM "
                    "already, something between this function and the database is not the "
                    "database"
                ) from exc
            if _login_refused(exc):
                raise LoginRefused(_login_refused_message(settings, exc)) from exc
            if not _not_ready(exc):
                raise
            remaining_s = _remaining_s(context)
            if remaining_s - delay_s < 30:
                raise
            logger.warning(
                "database not reachable yet (%s); retrying in %.0f s", type(exc).__name__, delay_s
            )
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 30.0)


def _login_refused(exc: psycopg.OperationalError) -> bool:
    text = str(exc).lower()
    return exc.sqlstate in _AUTH_SQLSTATES or any(words in text for words in _AUTH_FAILED)


def _not_ready(exc: psycopg.OperationalError) -> bool:
    text = str(exc).lower()
    return exc.sqlstate == "57P03" or any(words in text for words in _NOT_READY)


def _login_refused_message(settings: WriterSettings, exc: psycopg.OperationalError) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = redact(lines[0].rpartition("FATAL:")[2].strip()) if lines else type(exc).__name__
    user = settings.db_user or "(the secret's username)"
    return (
        f"{settings.db_host}:{settings.db_port} refused the login of user {user} ({reason}); "
        "not retried: check that the master secret "
        f"({settings.db_secret_arn or 'DB_SECRET_ARN'}) holds the instance's current master "
        "password, and that the password is stored as SCRAM-SHA-256 (an md5-stored one fails a "
        "SCRAM login with this same error): reset it with password_encryption=scram-sha-256 "
        "(the RDS for PostgreSQL 14+ default) and deploy again"
    )


def _remaining_s(context: Any) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000 if callable(remaining) else 0.0


def set_role_password(conn: Connection, password: str, *, role: str = WRITER_DB_USER) -> None:
    """``ALTER ROLE <role> PASSWORD …`` with the literal quoted by psycopg, never logged.

    DDL takes no bind parameters, so the password is composed as a safely quoted literal.
    """
    statement = sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(
        sql.Identifier(role), sql.Literal(password)
    )
    with conn.transaction():
        conn.execute(statement)


def _role_passwords(settings: WriterSettings) -> list[tuple[str, str]]:
    """(role, password) of each role whose secret the environment names.

    One read per secret, each naming its own setting: tests/infra/aws_calls traces every
    GetSecretValue to the variable that names the secret it reads.
    """
    if settings.writer_password_secret_arn is None and settings.pruner_password_secret_arn is None:
        return []
    secrets = client("secretsmanager", region=settings.aws_region, budget=MIGRATION_BUDGET)
    out = []
    if settings.writer_password_secret_arn is not None:
        value = secrets.get_secret_value(SecretId=settings.writer_password_secret_arn)
        out.append((WRITER_DB_USER, _password(value, "WRITER_PASSWORD_SECRET_ARN")))
    if settings.pruner_password_secret_arn is not None:
        value = secrets.get_secret_value(SecretId=settings.pruner_password_secret_arn)
        out.append((PRUNER_DB_USER, _password(value, "PRUNER_PASSWORD_SECRET_ARN")))
    return out


def _password(response: dict[str, Any], variable: str) -> str:
    value = json.loads(response["SecretString"])
    password = value.get("password") if isinstance(value, dict) else None
    if not isinstance(password, str) or not password:
        raise SettingsError(variable, "secret has no non-empty 'password' field")
    return password
