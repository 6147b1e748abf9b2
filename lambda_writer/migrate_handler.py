"""Deploy-time migrations: a CDK Trigger / custom-resource handler around ``apply_migrations``.

Connects with the writer's settings (the stack points them directly at the instance, as the
master user with the master secret, ``DB_TLS=channel-binding``), applies the pending migrations,
and, when ``WRITER_PASSWORD_SECRET_ARN`` is set, sets role ``ckpt_writer``'s password from that
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

from lambda_writer.aws import MIGRATION_BUDGET, client
from lambda_writer.connection import Connection, connect, describe
from lambda_writer.exceptions import SettingsError, WriterError
from lambda_writer.migrate import apply_migrations
from lambda_writer.settings import WRITER_ROLE, WriterSettings

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


class ChannelBindingRefused(WriterError):
    """The server offered no SCRAM-SHA-256-PLUS login: an md5 password, or not the database."""


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
    logger.info("migrating %s", describe(settings))
    with _connect_when_ready(settings, context) as conn:
        applied = apply_migrations(conn)
        secret_arn = settings.writer_password_secret_arn
        if secret_arn is not None:
            set_writer_password(conn, _secret_password(secret_arn, settings.aws_region))
            logger.info("password of role %s set from its secret", WRITER_ROLE)
    logger.info("applied migrations: %s", applied or "none pending")
    response["applied"] = applied
    if request_type is not None:
        response["Data"] = {"Applied": ",".join(applied)}
    return response


def _connect_when_ready(settings: WriterSettings, context: Any) -> Connection:
    """Connect, retrying while the database is not reachable yet.

    A failed migration rolls the whole deployment back, so a database that is still settling (a
    just-created instance, security group rules on their way) is retried until 30 s before the
    deadline. A refused channel binding is no such case and fails at once, saying what to do.
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
            remaining_s = _remaining_s(context)
            if remaining_s - delay_s < 30:
                raise
            logger.warning(
                "database not reachable yet (%s); retrying in %.0f s", type(exc).__name__, delay_s
            )
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 30.0)


def _remaining_s(context: Any) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000 if callable(remaining) else 0.0


def set_writer_password(conn: Connection, password: str) -> None:
    """``ALTER ROLE ckpt_writer PASSWORD …`` with the literal quoted by psycopg, never logged.

    DDL takes no bind parameters, so the password is composed as a safely quoted literal.
    """
    statement = sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(
        sql.Identifier(WRITER_ROLE), sql.Literal(password)
    )
    with conn.transaction():
        conn.execute(statement)


def _secret_password(secret_arn: str, region: str | None) -> str:
    secrets = client("secretsmanager", region=region, budget=MIGRATION_BUDGET)
    value = json.loads(secrets.get_secret_value(SecretId=secret_arn)["SecretString"])
    password = value.get("password") if isinstance(value, dict) else None
    if not isinstance(password, str) or not password:
        raise SettingsError(
            "WRITER_PASSWORD_SECRET_ARN", "secret has no non-empty 'password' field"
        )
    return password
