"""DB_TLS=channel-binding against a real PostgreSQL with TLS, secrets in moto's Secrets Manager.

The migration reaches the RDS instance directly without the RDS CA bundle: TLS with
``sslmode=require`` plus ``channel_binding=require``, so the login must be SCRAM-SHA-256-PLUS,
bound to the certificate the client saw. Here a throwaway cluster with a self-signed certificate
(which verify-full could not accept) plays the instance:

* a SCRAM password logs in, under ``scram-sha-256`` and under ``md5`` in pg_hba (RDS's
  ``rds.accepted_password_auth_method=md5+scram`` accepts both), and the migration handler applies
  the migrations and sets ckpt_writer's password, with which ckpt_writer logs in the same way;
* an md5-stored password under ``md5`` (an old instance's master) is refused by libpq, and the
  migration handler says in one line what to reset;
* a login the server refuses (a wrong password, or an md5-stored one under a SCRAM-only line: both
  "password authentication failed") fails the migration at once, in one line naming the user and
  the master secret, while a database that is not listening yet is retried;
* a server asking for a clear-text password (what a man in the middle without the SCRAM secret
  would ask for) gets no password: libpq refuses first;
* a server without TLS is refused.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import psycopg
import pytest
from psycopg import sql

from ckpt_pipeline.local.embedded_pg import (
    SUPERUSER,
    ThrowawayCluster,
    find_postgres_bin_dir,
    start_throwaway_cluster,
)
from lambda_writer.migrate import handler as migrate_handler
from lambda_writer.migrate.apply import load_migrations
from lambda_writer.migrate.exceptions import ChannelBindingRefused, LoginRefused
from lambda_writer.shared.connection import connect
from lambda_writer.shared.constants import WRITER_DB_USER as WRITER_ROLE
from lambda_writer.shared.settings import WriterSettings

pytestmark = pytest.mark.slow

PASSWORD = "Sc4am-only; 'quoted' p@ss"
# The admin logs in without a password (trust) over whatever it asks for; every other role must
# use TLS, with the method its line names (first match wins).
HBA = """\
host all postgres 127.0.0.1/32 trust
hostssl all cb_rds_like 127.0.0.1/32 md5
hostssl all cb_cleartext 127.0.0.1/32 password
hostssl all all 127.0.0.1/32 scram-sha-256
"""
NO_TLS_HBA = """\
host all postgres 127.0.0.1/32 trust
hostnossl all all 127.0.0.1/32 scram-sha-256
"""


@dataclass(frozen=True)
class Server:
    cluster: ThrowawayCluster

    def role(self, name: str, *, encryption: str, superuser: bool = False) -> None:
        """(Re)create login role ``name`` with PASSWORD stored as ``encryption``."""
        with psycopg.connect(self.cluster.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN {}").format(
                    sql.Identifier(name), sql.SQL("SUPERUSER" if superuser else "")
                )
            )
            # md5 is deprecated but still settable, as on instances created before PG 14.
            admin.execute("SELECT set_config('password_encryption', %s, false)", (encryption,))
            admin.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(PASSWORD)
                )
            )
            stored = admin.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)
            ).fetchone()
        assert stored is not None
        assert str(stored[0]).startswith("SCRAM-SHA-256$" if encryption != "md5" else "md5")

    def env(self, user: str, secret_arn: str) -> dict[str, str]:
        """The migration's environment as the stack sets it, pointed at this server."""
        return {
            "DB_HOST": "127.0.0.1",
            "DB_PORT": str(self.cluster.port),
            "DB_NAME": "postgres",
            "DB_USER": user,
            "DB_AUTH": "secret",
            "DB_SECRET_ARN": secret_arn,
            "DB_TLS": "channel-binding",
            "AWS_REGION": os.environ["AWS_REGION"],
        }


def _cluster_files(hba: str, *, tls: bool) -> tuple[Path, dict[str, str]]:
    """A temp dir with pg_hba (and a self-signed certificate) the server user can read."""
    root = Path(tempfile.mkdtemp(prefix="ckpt-cb-"))
    (root / "pg_hba.conf").write_text(hba)
    settings = {"hba_file": str(root / "pg_hba.conf"), "ssl": "on" if tls else "off"}
    if tls:
        key, cert = root / "server.key", root / "server.crt"
        self_signed = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        subprocess.run(
            [
                "openssl",
                *self_signed,
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
        (root / "server.key").chmod(0o600)  # PostgreSQL refuses a key others can read
        settings |= {
            "ssl_cert_file": str(root / "server.crt"),
            "ssl_key_file": str(root / "server.key"),
        }
    if os.geteuid() == 0:  # the cluster runs as the postgres user (embedded_pg)
        entry = pwd.getpwnam(SUPERUSER)
        for path in (root, *root.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    return root, settings


@contextmanager
def _server(hba: str, *, tls: bool) -> Iterator[Server]:
    if find_postgres_bin_dir() is None or (tls and shutil.which("openssl") is None):
        pytest.skip("needs PostgreSQL's initdb/pg_ctl" + (" and openssl" if tls else ""))
    root, settings = _cluster_files(hba, tls=tls)
    try:
        with start_throwaway_cluster(settings=settings) as cluster:
            yield Server(cluster)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[Server]:
    with _server(HBA, tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def plain_server() -> Iterator[Server]:
    with _server(NO_TLS_HBA, tls=False) as server:
        yield server


def _secret(user: str, password: str = PASSWORD) -> str:
    """A secret shaped like RDS's (username, password) in moto's Secrets Manager; its ARN."""
    secrets = boto3.client("secretsmanager", region_name=os.environ["AWS_REGION"])
    return str(
        secrets.create_secret(
            Name=f"cb-{user}-{uuid.uuid4().hex[:8]}",
            SecretString=json.dumps({"username": user, "password": password}),
        )["ARN"]
    )


class LambdaContext:
    """The part of Lambda's context the handler reads: the time left, one answer per call."""

    def __init__(self, remaining_ms: Sequence[int]) -> None:
        self._remaining_ms = list(remaining_ms)

    def get_remaining_time_in_millis(self) -> int:
        return self._remaining_ms.pop(0) if len(self._remaining_ms) > 1 else self._remaining_ms[0]


class Sleeps:
    """Stands in for ``time.sleep`` (the handler's back-off) while a test runs: records it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _migration_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("WRITER_PASSWORD_SECRET_ARN", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_a_scram_password_logs_in_with_channel_binding(
    tls_server: Server, moto_endpoint: str
) -> None:
    # GIVEN SCRAM passwords under scram-sha-256 and (as on RDS) md5 lines of pg_hba
    for user in ("cb_scram", "cb_rds_like"):
        tls_server.role(user, encryption="scram-sha-256")
        settings = WriterSettings.from_env(tls_server.env(user, _secret(user)))
        # WHEN connect() opens the connection as the migration would
        with connect(settings) as conn:
            # THEN it is logged in, over TLS
            row = conn.execute(
                "SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ).fetchone()
            assert row == (user, True)
            assert conn.pgconn.ssl_in_use


def test_an_md5_password_is_refused_with_a_clear_error(
    tls_server: Server, moto_endpoint: str
) -> None:
    # GIVEN an md5-stored password under an md5 line, as an old RDS instance's master
    tls_server.role("cb_rds_like", encryption="md5")
    settings = WriterSettings.from_env(tls_server.env("cb_rds_like", _secret("cb_rds_like")))
    # WHEN connect() tries THEN libpq refuses: the server asked for md5, which has no binding
    with pytest.raises(psycopg.OperationalError, match="channel binding required") as caught:
        connect(settings)
    assert "not supported by server's authentication request" in str(caught.value)


def test_the_migration_handler_names_the_md5_fix(
    tls_server: Server, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the migration's environment and an md5 master password
    tls_server.role("cb_rds_like", encryption="md5", superuser=True)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("WRITER_PASSWORD_SECRET_ARN", raising=False)
    for key, value in tls_server.env("cb_rds_like", _secret("cb_rds_like")).items():
        monkeypatch.setenv(key, value)
    # WHEN the trigger runs THEN it fails at once, in one line saying what to reset
    with pytest.raises(ChannelBindingRefused) as caught:
        migrate_handler.handler({"RequestType": "Create"}, None)
    message = str(caught.value)
    assert "\n" not in message
    assert "md5" in message and "password_encryption=scram-sha-256" in message
    assert "cb_rds_like" in message and str(tls_server.cluster.port) in message
    assert PASSWORD not in message


@pytest.mark.parametrize(
    ("stored_as", "secret_password"),
    [("scram-sha-256", "not-the-master-password"), ("md5", PASSWORD)],
    ids=["wrong-password", "md5-under-scram-only"],
)
def test_a_refused_login_fails_the_migration_at_once_in_one_line(
    tls_server: Server,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stored_as: str,
    secret_password: str,
) -> None:
    # GIVEN a master under pg_hba's SCRAM-only line whose login must fail: the secret's password
    # is wrong, or right but stored as md5 (no SCRAM secret to check it against)
    tls_server.role("cb_master", encryption=stored_as, superuser=True)
    secret_arn = _secret("cb_master", secret_password)
    _migration_env(monkeypatch, tls_server.env("cb_master", secret_arn))
    sleeps = Sleeps()
    monkeypatch.setattr(time, "sleep", sleeps)
    # WHEN the trigger runs with the whole of its 300 s ahead of it
    with (
        caplog.at_level(logging.WARNING, logger=migrate_handler.__name__),
        pytest.raises(LoginRefused) as caught,
    ):
        migrate_handler.handler({"RequestType": "Create"}, LambdaContext([300_000]))
    # THEN the server's refusal is what libpq reports
    cause = caught.value.__cause__
    assert isinstance(cause, psycopg.OperationalError)
    assert 'password authentication failed for user "cb_master"' in str(cause)
    # AND it failed at its first attempt: no back-off, no "retrying" line
    assert sleeps.seconds == [] and "retrying" not in caplog.text
    # AND says in one line whom, where and what to check, without any password
    message = str(caught.value)
    assert "\n" not in message
    assert "user cb_master" in message and f"127.0.0.1:{tls_server.cluster.port}" in message
    assert "password authentication failed" in message and secret_arn in message
    assert "SCRAM-SHA-256" in message and "password_encryption=scram-sha-256" in message
    assert PASSWORD not in message and secret_password not in message


def test_a_database_not_listening_yet_is_retried(
    tls_server: Server, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the migration pointed at a port nobody listens on (an instance not up yet)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    env = tls_server.env("cb_master", _secret("cb_master")) | {"DB_PORT": str(closed_port)}
    _migration_env(monkeypatch, env)
    sleeps = Sleeps()
    monkeypatch.setattr(time, "sleep", sleeps)
    # WHEN the trigger runs with time for one retry, then 10 s left
    with pytest.raises(psycopg.OperationalError, match="Connection refused"):
        migrate_handler.handler({"RequestType": "Create"}, LambdaContext([300_000, 10_000]))
    # THEN it backed off once and retried, then gave up short of its deadline with libpq's error
    assert sleeps.seconds == [5.0]


def test_the_migration_runs_and_its_writer_role_logs_in_the_same_way(
    tls_server: Server, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a SCRAM master (superuser here; rds_superuser on RDS) and the writer's secret
    tls_server.role("cb_master", encryption="scram-sha-256", superuser=True)
    writer_secret = _secret(WRITER_ROLE)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    for key, value in tls_server.env("cb_master", _secret("cb_master")).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WRITER_PASSWORD_SECRET_ARN", writer_secret)
    # WHEN the trigger runs THEN every migration is applied over the channel-bound connection
    result = migrate_handler.handler({"RequestType": "Create"}, None)
    assert result["applied"] == [m.name for m in load_migrations()]
    # AND ckpt_writer (created by it, password from its secret) logs in with channel binding
    settings = WriterSettings.from_env(tls_server.env(WRITER_ROLE, writer_secret))
    with connect(settings) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (WRITER_ROLE,)


def test_a_server_asking_for_a_cleartext_password_gets_none(
    tls_server: Server, moto_endpoint: str
) -> None:
    # GIVEN a server that asks for the password itself, as a man in the middle would
    tls_server.role("cb_cleartext", encryption="scram-sha-256")
    settings = WriterSettings.from_env(tls_server.env("cb_cleartext", _secret("cb_cleartext")))
    # WHEN connect() tries THEN libpq refuses before sending it
    with pytest.raises(psycopg.OperationalError, match="channel binding required"):
        connect(settings)


def test_a_server_without_tls_is_refused(plain_server: Server, moto_endpoint: str) -> None:
    # GIVEN a server without TLS and a SCRAM password it would accept over plain TCP
    plain_server.role("cb_scram", encryption="scram-sha-256")
    settings = WriterSettings.from_env(plain_server.env("cb_scram", _secret("cb_scram")))
    # WHEN connect() tries THEN it refuses to go on without TLS
    with pytest.raises(psycopg.OperationalError, match="SSL was required"):
        connect(settings)


def test_channel_binding_needs_a_secret_and_a_known_mode() -> None:
    base = {"DB_HOST": "h", "DB_NAME": "d", "DB_USER": "u", "AWS_REGION": "eu-west-1"}
    with pytest.raises(ValueError, match="DB_TLS: channel-binding needs DB_AUTH=secret"):
        WriterSettings.from_env({**base, "DB_TLS": "channel-binding"})
    with pytest.raises(ValueError, match="DB_TLS: must be one of verify-full, channel-binding"):
        WriterSettings.from_env({**base, "DB_TLS": "require"})
    assert WriterSettings.from_env(base).db_tls == "verify-full"
