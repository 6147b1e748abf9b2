"""The writer's configuration: read once per execution environment from env, frozen, validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from lambda_writer.shared.constants import DB_PORT, METRICS_NAMESPACE
from lambda_writer.shared.exceptions import SettingsError
from lambda_writer.shared.job_prefixes import JobPrefixes, parse_job_prefixes

# Amazon Root CA 1-4 + Starfield Services Root CA G2: the roots ACM certificates (which RDS Proxy
# presents) chain to; the RDS CA bundle does not verify the proxy.
BUNDLED_ROOT_CERT = Path(__file__).parent.parent / "certs" / "amazon-trust-services.pem"

DbAuth = Literal["iam", "secret"]
# verify-full: the server's certificate chains to DB_SSL_ROOT_CERT and names DB_HOST (the proxy's
# ACM certificate). channel-binding: TLS without a CA bundle, SCRAM-SHA-256-PLUS required: the
# password's SCRAM secret authenticates the server and the login is bound to the certificate the
# client saw (tls-server-end-point), so a man in the middle cannot complete it
# (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNECT-CHANNEL-BINDING,
# RFC 5802, RFC 5929). Used by the migration's direct connection to the instance: the code bundle
# does not ship the RDS CA bundle.
DbTls = Literal["verify-full", "channel-binding"]
DB_TLS_MODES: tuple[DbTls, ...] = get_args(DbTls)


@dataclass(frozen=True)
class WriterSettings:
    """Where and how the writer (and the migrator) connect, and where poison goes.

    ``database_url`` (local and tests) wins over the RDS Proxy fields. It may hold a password,
    so it is kept out of ``repr``.
    """

    database_url: str | None = field(default=None, repr=False)
    db_host: str | None = None
    db_port: int = DB_PORT
    db_name: str | None = None
    db_user: str | None = None
    db_auth: DbAuth = "iam"
    db_secret_arn: str | None = None
    db_ssl_root_cert: Path = BUNDLED_ROOT_CERT
    db_tls: DbTls = "verify-full"
    aws_region: str | None = None
    dlq_url: str | None = None
    # The migrator only: the secret whose ``password`` becomes role ckpt_writer's, and (a stack
    # with the scheduled prune) the one whose ``password`` becomes role ckpt_pruner's.
    writer_password_secret_arn: str | None = None
    pruner_password_secret_arn: str | None = None
    # The principal (a role's or user's unique id, AROA…/AIDA…) whose re-sends are replays: the
    # writer applies the original sender they carry only when this principal sent them (docs/
    # DESIGN.md, "Who may write a job"). None: no replay of another principal's job is applied.
    replay_principal_id: str | None = None
    # The stricter mode (``JOB_PREFIXES``): the job-id prefixes each principal may write; a
    # principal not listed writes none. None: any job id, bound to its first sender.
    job_prefixes: JobPrefixes | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WriterSettings:
        """Build from ``env`` (default ``os.environ``); raises :class:`SettingsError`."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        dlq_url = get("DLQ_URL")
        if dlq_url is not None and not dlq_url.startswith(("https://", "http://")):
            raise SettingsError(
                "DLQ_URL", f"must be an SQS queue URL (http[s]://…), got {dlq_url!r}"
            )
        region = get("AWS_REGION") or get("AWS_DEFAULT_REGION")
        writer_secret = get("WRITER_PASSWORD_SECRET_ARN")
        pruner_secret = get("PRUNER_PASSWORD_SECRET_ARN")
        for var, arn in (
            ("WRITER_PASSWORD_SECRET_ARN", writer_secret),
            ("PRUNER_PASSWORD_SECRET_ARN", pruner_secret),
        ):
            if arn is not None and not arn.startswith("arn:"):
                raise SettingsError(var, f"must be a secret's ARN (arn:…), got {arn!r}")
        replay_principal = get("REPLAY_PRINCIPAL_ID")
        if replay_principal is not None and (":" in replay_principal or " " in replay_principal):
            raise SettingsError(
                "REPLAY_PRINCIPAL_ID",
                "must be a role's or user's unique id (AROA…, AIDA…: aws iam get-role"
                f" --query Role.RoleId), without a session, got {replay_principal!r}",
            )
        prefixes_text = get("JOB_PREFIXES")
        job_prefixes = (
            None
            if prefixes_text is None
            else parse_job_prefixes(prefixes_text, name="JOB_PREFIXES")
        )
        database_url = get("DATABASE_URL")
        if database_url is not None:
            return cls(
                replay_principal_id=replay_principal,
                job_prefixes=job_prefixes,
                database_url=database_url,
                aws_region=region,
                dlq_url=dlq_url,
                writer_password_secret_arn=writer_secret,
                pruner_password_secret_arn=pruner_secret,
            )

        host = get("DB_HOST")
        auth = get("DB_AUTH") or "iam"
        if auth not in ("iam", "secret"):
            raise SettingsError("DB_AUTH", f"must be 'iam' or 'secret', got {auth!r}")
        port_text = get("DB_PORT") or str(DB_PORT)
        try:
            port = int(port_text)
        except ValueError:
            raise SettingsError("DB_PORT", f"must be an integer, got {port_text!r}") from None
        if not 1 <= port <= 65535:
            raise SettingsError("DB_PORT", f"must be between 1 and 65535, got {port}")
        secret_arn = get("DB_SECRET_ARN")
        name, user = get("DB_NAME"), get("DB_USER")
        if auth == "secret":
            # The secret may carry host/port/dbname/username; DB_* override it (DB_HOST is the
            # proxy endpoint, the secret's host is the instance behind it).
            if secret_arn is None:
                raise SettingsError("DB_SECRET_ARN", "is required when DB_AUTH=secret")
        else:
            for var, value in (("DB_HOST", host), ("DB_NAME", name), ("DB_USER", user)):
                if value is None:
                    raise SettingsError(
                        var, "is required when DATABASE_URL is unset and DB_AUTH=iam"
                    )
            if region is None:
                raise SettingsError("AWS_REGION", "is required for DB_AUTH=iam (token signing)")
        tls = get("DB_TLS") or "verify-full"
        if tls not in DB_TLS_MODES:
            raise SettingsError("DB_TLS", f"must be one of {', '.join(DB_TLS_MODES)}, got {tls!r}")
        if tls == "channel-binding" and auth != "secret":
            raise SettingsError(
                "DB_TLS",
                "channel-binding needs DB_AUTH=secret: channel binding is part of a SCRAM "
                "password login; an IAM token is a clear-text password it cannot protect",
            )
        cert = Path(get("DB_SSL_ROOT_CERT") or BUNDLED_ROOT_CERT)
        if not cert.is_file():
            raise SettingsError("DB_SSL_ROOT_CERT", f"must name a readable PEM file, got {cert}")
        return cls(
            db_host=host,
            db_port=port,
            db_name=name,
            db_user=user,
            db_auth=auth,  # type: ignore[arg-type]  # checked against the Literal above
            db_secret_arn=secret_arn,
            db_ssl_root_cert=cert,
            db_tls=tls,  # type: ignore[arg-type]  # checked against DB_TLS_MODES above
            aws_region=region,
            dlq_url=dlq_url,
            writer_password_secret_arn=writer_secret,
            pruner_password_secret_arn=pruner_secret,
            replay_principal_id=replay_principal,
            job_prefixes=job_prefixes,
        )


def metrics_namespace(env: Mapping[str, str] | None = None) -> str:
    """The EMF namespace: ``POWERTOOLS_METRICS_NAMESPACE``, default ``CkptPipeline``."""
    env = os.environ if env is None else env
    return env.get("POWERTOOLS_METRICS_NAMESPACE", "").strip() or METRICS_NAMESPACE
