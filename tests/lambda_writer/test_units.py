"""Pure parts of the writer: settings, redaction, classification, planning, SQL, DLQ entries."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from ckpt_contract.dlq import dlq_dedup_id
from infra.constants import MIGRATION_TIMEOUT_S, WRITER_TIMEOUT_S
from lambda_writer import migrations
from lambda_writer.migrate import apply as migrate
from lambda_writer.migrate.exceptions import MigrationError
from lambda_writer.shared.aws import MIGRATION_BUDGET, WRITER_BUDGET
from lambda_writer.shared.connection import (
    CONNECT_TIMEOUT_S,
    ConnectionHolder,
    connect,
    describe_target,
    redact,
)
from lambda_writer.shared.exceptions import (
    SettingsError,
    TransientWriteError,
    WriterError,
)
from lambda_writer.shared.settings import BUNDLED_ROOT_CERT, WriterSettings
from lambda_writer.writer import sql
from lambda_writer.writer.batch import CheckpointWriter
from lambda_writer.writer.dlq import MAX_BATCH_BYTES, chunk_entries, dlq_entry, entry_size
from lambda_writer.writer.exceptions import MalformedEvent
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import (
    Poison,
    SqsMessage,
    ValidReport,
    classify,
    parse_event,
)
from tests.lambda_writer.helpers import body, sqs_messages


@pytest.mark.parametrize(
    ("env", "name", "rule"),
    [
        ({}, "DB_HOST", "is required"),
        ({"DB_HOST": "h", "DB_NAME": "d", "DB_USER": "u"}, "AWS_REGION", "is required"),
        ({"DB_AUTH": "kerberos"}, "DB_AUTH", "must be 'iam' or 'secret'"),
        ({"DB_AUTH": "secret"}, "DB_SECRET_ARN", "is required"),
        ({"DB_HOST": "h", "DB_PORT": "x"}, "DB_PORT", "must be an integer"),
        ({"DB_HOST": "h", "DB_PORT": "70000"}, "DB_PORT", "must be between 1 and 65535"),
        ({"DATABASE_URL": "postgresql://x", "DLQ_URL": "sqs-name"}, "DLQ_URL", "must be an SQS"),
        (
            {"DATABASE_URL": "postgresql://x", "WRITER_PASSWORD_SECRET_ARN": "name"},
            "WRITER_PASSWORD_SECRET_ARN",
            "must be a secret's ARN",
        ),
        (
            {"DB_AUTH": "secret", "DB_SECRET_ARN": "arn", "DB_SSL_ROOT_CERT": "/nope.pem"},
            "DB_SSL_ROOT_CERT",
            "must name a readable PEM file",
        ),
    ],
)
def test_settings_errors_name_the_variable_and_rule(
    env: dict[str, str], name: str, rule: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        WriterSettings.from_env(env)
    # One shape across the packages: (name, rule), like ReporterConfigError and ConfigError.
    assert raised.value.name == name and raised.value.rule.startswith(rule)
    assert str(raised.value).startswith(f"{name}: {rule}")


def test_one_error_root_per_package() -> None:
    assert issubclass(MigrationError, WriterError) and issubclass(SettingsError, WriterError)
    assert migrate.MigrationError is MigrationError


def test_every_aws_call_fits_the_functions_timeouts() -> None:
    # The writer may read its DB secret, connect, and send poison to the DLQ in one invocation;
    # both AWS calls at their worst plus the DB connect timeout leave time for the batch.
    writer_worst = 2 * WRITER_BUDGET.worst_case_s() + CONNECT_TIMEOUT_S
    assert writer_worst <= WRITER_TIMEOUT_S - 5
    # The migrator reads two secrets (its DB secret, the writer's) and keeps 30 s for the rest.
    assert 2 * MIGRATION_BUDGET.worst_case_s() + CONNECT_TIMEOUT_S <= MIGRATION_TIMEOUT_S - 30
    # botocore's defaults (60 s connect + 60 s read) would not fit a single attempt.
    assert WRITER_BUDGET.connect_timeout_s + WRITER_BUDGET.read_timeout_s < 60


def test_every_aws_client_of_the_functions_comes_from_aws_client() -> None:
    # No module makes a boto3 client with botocore's defaults behind aws.client's back.
    package = Path(migrations.__file__).parent.parent
    offenders = [
        path.name
        for path in package.glob("*.py")
        if path.name != "aws.py"
        and re.search(r"boto3\.client\(|boto3\.Session\(", path.read_text())
    ]
    assert offenders == []


def test_settings_defaults_and_database_url_wins() -> None:
    iam = WriterSettings.from_env(
        {"DB_HOST": "prx", "DB_NAME": "ckpt", "DB_USER": "ckpt_writer", "AWS_REGION": "eu-west-1"}
    )
    assert (iam.db_port, iam.db_auth, iam.db_ssl_root_cert) == (5432, "iam", BUNDLED_ROOT_CERT)
    assert iam.dlq_url is None
    local = WriterSettings.from_env({"DATABASE_URL": "postgresql://u:pw@h/db", "DB_AUTH": "bad"})
    assert local.database_url == "postgresql://u:pw@h/db"
    assert "pw" not in repr(local)


def test_bundled_roots_are_the_amazon_trust_services_roots() -> None:
    text = Path(BUNDLED_ROOT_CERT).read_text()
    assert text.count("-----BEGIN CERTIFICATE-----") == 5
    for name in [f"Amazon Root CA {i}" for i in range(1, 5)]:
        assert name in text
    assert "Starfield Services Root Certificate Authority - G2" in text


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("postgresql://writer:s3cr%40t@db.example:5432/ckpt", "s3cr%40t"),
        ("host=db user=writer password=hunter2 dbname=ckpt", "hunter2"),
        ("host=db password='with space' dbname=ckpt", "with space"),
        ("postgresql://db/ckpt?user=w&password=tok.en&sslmode=verify-full", "tok.en"),
    ],
)
def test_redact_removes_passwords(dsn: str, secret: str) -> None:
    redacted = redact(f"connecting to {dsn} failed")
    assert secret not in redacted
    assert "***" in redacted


def test_describe_never_shows_the_password() -> None:
    text = describe_target(WriterSettings(database_url="postgresql://writer:hunter2@db:5432/ckpt"))
    assert "hunter2" not in text and "db" in text


def test_iam_mode_requires_verified_tls_and_never_logs_the_token(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN IAM settings against the local server, which speaks no TLS
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings = WriterSettings(
        db_host="127.0.0.1", db_name="postgres", db_user="ckpt_writer", aws_region="us-east-1"
    )
    # WHEN connecting, THEN the client insists on TLS (a token is signed locally, never sent)
    with caplog.at_level("DEBUG"), pytest.raises(psycopg.OperationalError) as err:
        connect(settings)
    assert "SSL" in str(err.value) or "ssl" in str(err.value)
    assert "X-Amz-Signature" not in caplog.text and "X-Amz-Signature" not in str(err.value)


def test_unreachable_db_is_a_transient_error() -> None:
    settings = WriterSettings(database_url="postgresql://postgres@127.0.0.1:1/x")
    holder = ConnectionHolder(settings)
    writer = CheckpointWriter(settings, connection=holder)
    result = writer.process(sqs_messages([body()]))
    assert len(result.failed) == 1 and result.transient_failures == 1
    assert not holder.is_open
    with pytest.raises(TransientWriteError):
        writer._write([classify(sqs_messages([body()])[0])])  # type: ignore[list-item]


def test_parse_event_rejects_non_sqs_events() -> None:
    with pytest.raises(MalformedEvent):
        parse_event({"detail-type": "Scheduled Event"})
    with pytest.raises(MalformedEvent):
        parse_event({"Records": [{"body": "{}"}]})


def _message(text: str, **kw: object) -> SqsMessage:
    fields: dict[str, object] = {
        "message_id": "m-1",
        "body": text,
        "group_id": "job-a:0",
        "receive_count": 3,
        "first_receive_ms": 1767225600123,
        "sequence_number": "1",
        "source_arn": "arn:aws:sqs:us-east-1:000000000000:q-checkpoints.fifo",
    }
    fields.update(kw)
    return SqsMessage(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "error_class"),
    [
        ("{oops", "UndecodableBody"),
        ("", "UndecodableBody"),
        (body().replace('"loss":0.5', '"loss":NaN'), "InvalidMessage"),
        (body().replace('"ckpt.v1"', '"ckpt.v2"'), "UnknownSchema"),
        (json.dumps({"schema": "ckpt.v1"}), "InvalidMessage"),
        ("x" * (70 * 1024), "MessageTooLarge"),
    ],
)
def test_classify_poison(text: str, error_class: str) -> None:
    result = classify(_message(text))
    assert isinstance(result, Poison)
    assert result.error_class == error_class
    assert result.reason


def test_classify_valid() -> None:
    assert isinstance(classify(_message(body())), ValidReport)


def test_first_seen_at_is_rfc3339() -> None:
    assert _message("").first_seen_at == "2026-01-01T00:00:00.123Z"


def _valid(**overrides: object) -> ValidReport:
    result = classify(_message(body(**overrides), message_id=f"m-{overrides}"))
    assert isinstance(result, ValidReport)
    return result


def test_plan_merges_per_key_and_sorts() -> None:
    plan = plan_batch(
        [
            _valid(step=2, rank=1),
            _valid(step=1, rank=3, run_attempt=1, world_size=8, epoch=7),
            _valid(step=1, rank=3),
            _valid(step=1, rank=0, created_at=datetime(2025, 1, 1, tzinfo=UTC)),
            _valid(step=2, rank=1),
        ]
    )
    assert [c.key for c in plan.checkpoints] == [("job-a", 1), ("job-a", 2)]
    assert [s.key for s in plan.shards] == [("job-a", 1, 0), ("job-a", 1, 3), ("job-a", 2, 1)]
    first = plan.checkpoints[0]
    assert (first.run_attempt, first.world_size, first.epoch) == (1, 8, 7)
    assert first.first_reported_at == datetime(2025, 1, 1, tzinfo=UTC)
    assert plan.shards[1].run_attempt == 1
    assert (plan.records, plan.duplicates) == (5, 2)


def test_sql_is_one_set_based_statement_without_session_state() -> None:
    function = (Path(migrations.__file__).parent / "0003_write_batch_function.sql").read_text()
    body = function.split("$fn$")[1]
    # What RDS Proxy cares about (session state pins the client to one backend) is checked here;
    # what the function does is checked against the database by the repository tests.
    assert "VOLATILE" in function  # fresh snapshot per statement: the recount sees committers
    forbidden = (
        r"\b(PREPARE|DEALLOCATE|DISCARD|SAVEPOINT|pg_advisory\w*|TEMP|TEMPORARY|LISTEN|nextval"
        r"|set_config|EXECUTE)\b"
    )
    for text in (body, sql.WRITE_BATCH):
        assert not re.search(forbidden, text, re.IGNORECASE)
        assert not re.search(r"^\s*SET\b", text, re.IGNORECASE | re.MULTILINE)
    # The job claims (0015), the launch claims (0018), the checkpoint rows, the shard rows.
    assert sql.WRITE_BATCH.count("%s::json") == 4 and ";" not in sql.WRITE_BATCH


def test_dlq_entry_and_dedup_id() -> None:
    poison = classify(_message("{oops\x00"))
    assert isinstance(poison, Poison)
    entry = dlq_entry(poison, "p0")
    assert entry["MessageBody"] == "{oops\x00"
    assert entry["MessageGroupId"] == "job-a:0"
    # A known vector (sha256 of "ckpt-dlq|<messageId>"): the same poison message dead-lettered
    # twice (a redelivery after a timeout) is one DLQ message, and a different one is another.
    assert entry["MessageDeduplicationId"] == (
        "c1ccabd313a91b36d5574f17948b587a7d1b802fde281cfaa4774d059caeaf06"
    )
    assert dlq_dedup_id("m-2") != dlq_dedup_id("m-1")
    assert len(entry["MessageDeduplicationId"]) <= 128
    attrs = {k: v["StringValue"] for k, v in entry["MessageAttributes"].items()}
    assert attrs["ErrorClass"] == "UndecodableBody"
    assert attrs["OriginalMessageId"] == "m-1"
    assert attrs["FirstSeenAt"] == "2026-01-01T00:00:00.123Z"
    assert attrs["ReceiveCount"] == "3"
    assert attrs["SourceQueueArn"].endswith("q-checkpoints.fifo")


def test_dlq_error_message_is_truncated_and_clean() -> None:
    poison = Poison(_message("b"), "X", "bad \x00 char " + "y" * 5000)
    value = dlq_entry(poison, "p0")["MessageAttributes"]["ErrorMessage"]["StringValue"]
    assert len(value) == 1024 and "\x00" not in value


def test_chunks_respect_count_and_size_limits() -> None:
    big = Poison(_message("x" * 400_000), "X", "r")
    small = Poison(_message("x"), "X", "r")
    entries = [dlq_entry(p, f"p{i}") for i, p in enumerate([big, big, big, *[small] * 12])]
    chunks = list(chunk_entries(entries))
    assert [len(c) for c in chunks] == [2, 10, 3]
    assert all(sum(entry_size(e) for e in c) <= MAX_BATCH_BYTES for c in chunks)


def test_importing_the_handler_stays_light() -> None:
    # What the import pulls in, not how long it takes (that is bench.cold_start's figure). Kept
    # out: what a first batch of valid reports does not need, each costing ms to hundreds of ms
    # (BENCHMARKS.md, cold start): the DLQ module (poison only), boto3 and botocore's session
    # and client machinery (a DLQ send or an IAM token only), the X-Ray SDK (Tracer, in Lambda
    # only), and what the writer never uses. botocore's bare package is imported by Powertools'
    # user agent (0.6 ms); its session is not.
    heavy = (
        "torch", "aws_cdk", "moto", "boto3", "botocore.session", "botocore.client",
        "botocore.auth", "aws_xray_sdk", "lambda_writer.writer.dlq", "lambda_writer.migrate.apply",
    )  # fmt: skip
    # Needed by the first batch (decode, write), so imported at init, where Lambda's INIT phase
    # pays for them once per execution environment (the handler's pydantic and psycopg shares).
    needed = ("ckpt_contract.message", "psycopg", "lambda_writer.writer.batch")
    code = (
        "import sys; import lambda_writer.writer.handler; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules)); "
        f"print(sorted(m for m in {needed!r} if m not in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_TASK_ROOT"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert out[-2:] == ["[]", "[]"]


@pytest.mark.parametrize("collecting", [True, False])
def test_the_handlers_import_runs_no_collection_and_freezes_what_it_built(collecting: bool) -> None:
    # Cold start (BENCHMARKS.md §5): no garbage collection runs while the handler's modules load,
    # what they built is frozen, and the collector is as the host process had it before.
    code = f"""
import gc, sys
runs = []
def in_handler_module(phase, info):
    frame = sys._getframe()
    while frame and frame.f_globals.get("__name__") != "lambda_writer.writer.handler":
        frame = frame.f_back
    if phase == "start" and frame is not None:
        runs.append(info["generation"])
gc.callbacks.append(in_handler_module)
gc.enable() if {collecting} else gc.disable()
frozen = gc.get_freeze_count()
import lambda_writer.writer.handler
print(runs, gc.get_freeze_count() > frozen + 10_000, gc.isenabled())
"""
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_TASK_ROOT"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert out[-1] == f"[] True {collecting}"


def test_poison_imports_the_dlq_module_when_first_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    # The deferral keeps behaviour: the first poison record builds the DLQ sender (here with no
    # reachable endpoint: the send fails and the record is reported for retry, as before).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    settings = WriterSettings(
        database_url="postgresql://postgres@127.0.0.1:1/none",
        dlq_url="http://127.0.0.1:9/000000000000/dlq.fifo",
        aws_region="us-east-1",
    )
    writer = CheckpointWriter(settings)
    messages = sqs_messages(["not json"])
    result = writer.process(messages)
    assert (result.poison, result.poison_unsent) == (1, 1)
    assert result.failed == [messages[0].message_id]
    assert writer._dlq is not None and writer._dlq.queue_url == settings.dlq_url


def test_clientless_rds_auth_token_is_botocores_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # Byte for byte the token of an RDS client, at one frozen instant: a botocore upgrade that
    # changes what generate_db_auth_token reads from its client fails here, not at connect.
    import boto3
    import botocore.auth

    from lambda_writer.shared.aws import WRITER_BUDGET, rds_auth_token

    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token")
    frozen = datetime(2026, 12, 3, 12, 0, 0)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: frozen)
    host, port, user = "writer.proxy-abc.eu-west-1.rds.amazonaws.com", 5432, "ckpt_writer"
    # A new session: boto3's default one keeps the credentials an earlier test resolved.
    rds = boto3.session.Session().client(
        "rds", region_name="eu-west-1", config=WRITER_BUDGET.config()
    )
    expected = rds.generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user)
    token = rds_auth_token(host=host, port=port, user=user, region="eu-west-1")
    assert token == expected
    assert token.startswith(f"{host}:{port}/?Action=connect&DBUser={user}&")
    assert "X-Amz-Date=20261203T120000Z" in token and "X-Amz-Expires=900" in token
    # ... and it is the token the writer's connect uses (no RDS client, no warning).
    from lambda_writer.shared.connection import _iam_token
    from lambda_writer.shared.settings import WriterSettings

    settings = WriterSettings.from_env(
        {"DB_HOST": host, "DB_NAME": "ckpt", "DB_USER": user, "AWS_REGION": "eu-west-1"}
    )
    assert _iam_token(settings, WRITER_BUDGET) == expected


def test_secret_mode_reads_the_secret_and_insists_on_tls(
    moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    import uuid

    import boto3

    password = f"pw-{uuid.uuid4().hex}"
    arn = boto3.client("secretsmanager", region_name="us-east-1").create_secret(
        Name=f"db-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps(
            {"username": "ckpt_writer", "password": password, "host": "127.0.0.1",
             "port": 5432, "dbname": "postgres"}
        ),
    )["ARN"]  # fmt: skip
    settings = WriterSettings.from_env(
        {"DB_AUTH": "secret", "DB_SECRET_ARN": arn, "AWS_REGION": "us-east-1"}
    )
    with caplog.at_level("DEBUG"), pytest.raises(psycopg.OperationalError) as err:
        connect(settings)
    # The host/port/dbname came from the secret; the local server speaks no TLS.
    assert "127.0.0.1" in str(err.value) and "SSL" in str(err.value).upper()
    assert password not in str(err.value) and password not in caplog.text
