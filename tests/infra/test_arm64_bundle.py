"""The exact asset ``cdk synth`` produced, run on its real platform: arm64 + Python 3.14.

The host is x86_64, so the synthesized writer asset (aarch64 wheels of psycopg-binary and
pydantic-core) never ran here before. This test copies it into a Debian arm64 root with python3.14
(built once by ``.ci/setup-arm64.sh``, run through qemu-user), lays it out as Lambda does
(``/var/task`` = the asset, ``/var/runtime`` = the runtime's boto3, the runtime's environment
variables plus the function's own from the template) and, in ONE chroot'ed python process (qemu
costs about a minute per interpreter): imports both handlers by the template's ``Handler``
strings, runs the migration handler on a fresh database, then the writer on a real SQS event (one
valid report, one poison record). The host then checks the row and the dead-lettered message.

What stands in for AWS, through settings the code supports for local use: ``DATABASE_URL`` instead
of the RDS Proxy fields (IAM auth needs a real proxy), moto's server on loopback (the chroot shares
the host's network) for Secrets Manager and the DLQ, reached through ``AWS_ENDPOINT_URL``.

Skipped off CI when the root is missing or we are not root; under CI=true it fails instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from psycopg import sql

from ckpt_pipeline.local.sqs_events import receive_kwargs, sqs_event
from ckpt_pipeline.local.sqs_server import PipelineQueues, local_aws_env
from infra import constants
from infra.bundling import BYTECODE_PYTHON_ENV
from lambda_writer.migrate.apply import load_migrations
from tests.conftest import ADMIN_URL, empty_database
from tests.infra.conftest import REPO_ROOT
from tests.lambda_writer.helpers import body, checkpoint_rows, dlq_messages, shard_rows

CACHE = Path("/var/cache/ckpt-pipeline")
ROOT = Path(os.environ.get("ARM64_ROOT", str(CACHE / "arm64-root")))
MARKER = ROOT / ".ckpt-arm64-complete"  # written last by .ci/setup-arm64.sh
BINFMT_ENTRY = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
SETUP_HINT = "run `bash .ci/setup-arm64.sh` as root (builds it once, ~6 min)"
PYTHON = f"/usr/bin/python{constants.LAMBDA_PYTHON_VERSION}"
# /usr/sbin is not on every PATH (CI's environment need not be a login shell's).
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
RESULT_PREFIX = "CKPT-ARM64-RESULT "
# Lambda's sys.path order: the function's code first, then the runtime's libraries (boto3).
TASK_ROOT, RUNTIME_DIR = "/var/task", "/var/runtime"

# What the Lambda runtime itself sets in every execution environment (reserved and unreserved
# "defined runtime environment variables",
# https://docs.aws.amazon.com/lambda/latest/dg/configuration-envvars.html#configuration-envvars-runtime).
# The function-specific ones (_HANDLER, AWS_LAMBDA_FUNCTION_*) are added per function below.
LAMBDA_RUNTIME_ENV = {
    "LAMBDA_TASK_ROOT": TASK_ROOT,
    "LAMBDA_RUNTIME_DIR": RUNTIME_DIR,
    "AWS_EXECUTION_ENV": f"AWS_Lambda_python{constants.LAMBDA_PYTHON_VERSION}",
    "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
    "LANG": "en_US.UTF-8",
    "TZ": ":UTC",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONPATH": f"{TASK_ROOT}:{RUNTIME_DIR}",
}


def _unavailable() -> str | None:
    """Why the arm64 run cannot happen on this machine, or None."""
    if os.geteuid() != 0:
        return "the arm64 bundle test needs root (chroot)"
    if not MARKER.is_file():
        return f"no complete Debian arm64 root at {ROOT}: {SETUP_HINT}"
    if not BINFMT_ENTRY.is_file():
        return f"qemu-aarch64 binfmt handler not registered: {SETUP_HINT}"
    if shutil.which("npx") is None:
        return "npx not found: the test synthesizes with the real CDK CLI"
    return None


@dataclass(frozen=True)
class LambdaFunction:
    """What the template says about one Python function: handler, limits, environment."""

    handler: str
    runtime: str
    architectures: list[str]
    timeout_s: int
    memory_mb: int
    environment: dict[str, Any]
    tracing: str | None
    asset: Path


@dataclass(frozen=True)
class SynthesizedAsset:
    """The writer asset from a real ``cdk synth`` and the two functions that run it."""

    asset: Path
    writer: LambdaFunction
    migrator: LambdaFunction


def _functions(out: Path) -> dict[str, LambdaFunction]:
    template = json.loads((out / "ckpt-checkpoint-pipeline.template.json").read_text())
    found: dict[str, LambdaFunction] = {}
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] != "AWS::Lambda::Function" or not str(
            props.get("Runtime", "")
        ).startswith("python"):
            continue
        found[props["Handler"]] = LambdaFunction(
            handler=props["Handler"],
            runtime=props["Runtime"],
            architectures=props.get("Architectures", ["x86_64"]),
            timeout_s=int(props.get("Timeout", 3)),
            memory_mb=int(props.get("MemorySize", 128)),
            environment=dict(props.get("Environment", {}).get("Variables", {})),
            tracing=props.get("TracingConfig", {}).get("Mode"),
            # The cloud assembly names the asset directory in the function's metadata.
            asset=out / resource["Metadata"]["aws:asset:path"],
        )
    return found


@pytest.fixture(scope="module")
def arm64_root() -> Path:
    """The cached root; skip off CI when unavailable, fail under CI (which must build it)."""
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI=true: `make test-services` must have built it)")
        pytest.skip(reason)
    return ROOT


@pytest.fixture(scope="module")
def synthesized(arm64_root: Path, tmp_path_factory: pytest.TempPathFactory) -> SynthesizedAsset:
    """``npx cdk synth`` from the repository root, with the real local bundling."""
    out = tmp_path_factory.mktemp("arm64-synth") / "cdk.out"
    env = {
        **os.environ,
        "CDK_DISABLE_VERSION_CHECK": "true",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        # No native python3.14 here: the bundle's bytecode is compiled by the root's (qemu).
        BYTECODE_PYTHON_ENV: str(REPO_ROOT / ".ci" / "arm64-python"),
        "ARM64_ROOT": str(arm64_root),
    }
    # A hang guard, not a speed check: the synth compiles the bundle's bytecode under qemu, 68 s
    # at load 2 here, and over 230 s on a fresh machine at load 8 (the first clean-clone CI of
    # 2026-12-06, beside three engineers' builds), where the old 230 s limit failed the run.
    result = subprocess.run(
        ["npx", "cdk", "synth", "--no-notices", "-q", "-o", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    functions = _functions(out)
    writer = functions[constants.WRITER_HANDLER]
    migrator = functions[constants.MIGRATION_HANDLER]
    # infra.bundling.writer_code: one asset, two handlers. The chroot holds one /var/task.
    assert writer.asset == migrator.asset, "writer and migrator no longer share one asset"
    assert writer.asset.is_dir()
    return SynthesizedAsset(asset=writer.asset, writer=writer, migrator=migrator)


def _boto3_pin() -> str:
    """The boto3 version the project pins (the Lambda runtime provides boto3; the bundle not)."""
    for path in (REPO_ROOT / "lambda_writer" / "requirements.txt", REPO_ROOT / "requirements.txt"):
        match = re.search(r"^boto3==(\S+)", path.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    raise AssertionError("boto3 is not pinned (boto3==X) in lambda_writer/ or root requirements")


@pytest.fixture(scope="module")
def runtime_boto3(arm64_root: Path) -> Path:
    """The pinned boto3 installed for arm64 / CPython 3.14, cached per version outside the repo.

    Byte-compiled once inside the root, as the runtime's own SDK is: compiling botocore under
    qemu costs about 20 s of CPU on every run otherwise.
    """
    version = _boto3_pin()
    target = CACHE / f"arm64-runtime-boto3-{version}"
    if (target / ".complete").is_file():
        return target
    # Built inside the root (so that its python can compile it), moved to the cache when done.
    inside = f"/tmp/boto3-{version}.partial-{os.getpid()}"
    partial = arm64_root / inside.lstrip("/")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        str(REPO_ROOT / ".venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
        "--disable-pip-version-check", "--no-compile", "--target", str(partial),
        "--platform", "manylinux2014_aarch64", "--implementation", "cp",
        "--python-version", constants.LAMBDA_PYTHON_VERSION, "--only-binary=:all:",
        f"boto3=={version}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"pip install of arm64 boto3 failed:\n{result.stderr[-3000:]}"
    shutil.rmtree(partial / "bin", ignore_errors=True)
    # -s/-p: the .pyc files name their sources where they will be, under /var/runtime.
    compiled = subprocess.run(
        [CHROOT, str(arm64_root), "/usr/bin/env", "-i", "PATH=/usr/bin:/bin", PYTHON,
         "-m", "compileall", "-q", "-j", "0", "-s", inside, "-p", RUNTIME_DIR, inside],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, (compiled.stdout[-2000:], compiled.stderr[-2000:])
    (partial / ".complete").write_text(f"boto3=={version}\n")
    shutil.rmtree(target, ignore_errors=True)
    shutil.move(partial, target)
    return target


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database (the migration handler creates the schema); dropped afterwards."""
    with empty_database("ckpt_arm64") as url:
        yield url


@pytest.fixture
def writer_password_secret(moto_endpoint: str) -> Iterator[tuple[str, str]]:
    """A writer-password secret in moto (ARN, password); role ckpt_writer's password restored.

    ckpt_writer is a cluster-wide role that other tests use: put its password back afterwards.
    """
    password = f"arm64-{uuid.uuid4().hex}"
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    arn = secrets.create_secret(
        Name=f"writer-arm64-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps({"username": "ckpt_writer", "password": password}),
    )["ARN"]
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'ckpt_writer'"
        ).fetchone()
    existed, previous = row is not None, row[0] if row else None
    try:
        yield arn, password
    finally:
        if existed:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER ROLE ckpt_writer PASSWORD {}").format(
                        sql.Literal(previous) if previous is not None else sql.SQL("NULL")
                    )
                )


def _received_event(sqs: Any, queues: PipelineQueues, bodies: list[tuple[str, str]]) -> Any:
    """Send (body, group) pairs to moto's FIFO queue, receive them: Lambda's SQS event."""
    for text, group in bodies:
        sqs.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=text,
            MessageGroupId=group,
            MessageDeduplicationId=uuid.uuid4().hex,
        )
    received: list[dict[str, Any]] = []
    while len(received) < len(bodies):
        got = sqs.receive_message(
            QueueUrl=queues.queue_url,
            **receive_kwargs(max_messages=10, wait_time_s=1, visibility_timeout_s=600),
        ).get("Messages", [])
        assert got, f"moto returned {len(received)} of {len(bodies)} messages"
        received.extend(got)
    for message in received:
        sqs.delete_message(QueueUrl=queues.queue_url, ReceiptHandle=message["ReceiptHandle"])
    return sqs_event(received, queue_arn=queues.queue_arn)


def _function_env(
    function: LambdaFunction, name: str, stand_ins: Mapping[str, str], aws: Mapping[str, str]
) -> dict[str, str]:
    """The runtime's variables, the template's (tokens replaced by local stand-ins), AWS's."""
    env = {
        **LAMBDA_RUNTIME_ENV,
        "_HANDLER": function.handler,
        "AWS_LAMBDA_FUNCTION_NAME": name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_mb),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": "arm64-chroot",
        **aws,
    }
    # DATABASE_URL wins over the RDS Proxy fields (lambda_writer.shared.settings): IAM auth and the
    # proxy endpoint exist only in AWS. DB_HOST (the proxy's endpoint) gets the URL's host.
    stand_ins = {
        "DB_HOST": str(psycopg.conninfo.conninfo_to_dict(stand_ins["DATABASE_URL"])["host"]),
        **stand_ins,
    }
    for key, value in function.environment.items():
        if isinstance(value, str):
            env[key] = value
        elif key in stand_ins:
            env[key] = stand_ins[key]
        else:
            # A deploy-time value (Ref/GetAtt) this test does not know how to stand in for.
            raise AssertionError(f"{function.handler}: no local stand-in for {key}={value}")
    env["DATABASE_URL"] = stand_ins["DATABASE_URL"]
    if function.tracing == "Active":
        # Lambda passes the trace header per invocation when active tracing is on (and the
        # daemon's address); segments sent to a loopback port nobody reads are lost harmlessly.
        env["_X_AMZN_TRACE_ID"] = (
            f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]};"
            f"Parent={uuid.uuid4().hex[:16]};Sampled=1"
        )
        env["AWS_XRAY_DAEMON_ADDRESS"] = "127.0.0.1:2000"
        env["AWS_XRAY_CONTEXT_MISSING"] = "LOG_ERROR"
    return env


# Runs inside the chroot under qemu: one interpreter for every step. It imports each handler the
# way Lambda's bootstrap does (module from the _HANDLER string, under that function's environment)
# and invokes it with a context object carrying what Lambda's does.
DRIVER = r"""
import importlib, importlib._bootstrap_external as bootstrap, json, os, platform, sys, time, uuid

# Every module the import system compiles from source under /var/task: none when the bundle's
# bytecode is there and valid for this interpreter (Lambda cannot write a cache in /var/task).
compiled_in_task = []
_source_to_code = bootstrap.SourceLoader.source_to_code

def _recording_source_to_code(self, data, path, *args, **kwargs):
    if str(path).startswith("/var/task/"):
        compiled_in_task.append(str(path))
    return _source_to_code(self, data, path, *args, **kwargs)

bootstrap.SourceLoader.source_to_code = _recording_source_to_code

class Context:
    def __init__(self, env, timeout_s):
        self.function_name = env["AWS_LAMBDA_FUNCTION_NAME"]
        self.function_version = env["AWS_LAMBDA_FUNCTION_VERSION"]
        self.invoked_function_arn = (
            "arn:aws:lambda:" + env["AWS_REGION"] + ":000000000000:function:" + self.function_name
        )
        self.memory_limit_in_mb = int(env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"])
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = env["AWS_LAMBDA_LOG_GROUP_NAME"]
        self.log_stream_name = env["AWS_LAMBDA_LOG_STREAM_NAME"]
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self):
        return max(0, int((self._deadline - time.monotonic()) * 1000))

def invoke(step):
    os.environ.clear()
    os.environ.update(step["env"])
    module_name, _, attr = step["env"]["_HANDLER"].rpartition(".")
    handler = getattr(importlib.import_module(module_name), attr)
    return handler(step["event"], Context(step["env"], step["timeout_s"]))

spec = json.load(sys.stdin)
result, seconds = {}, {}
for key, step in (("migrate", "migrator"), ("writer", "writer")):
    cpu, wall = time.process_time(), time.monotonic()
    result[key] = invoke(spec[step])
    seconds[key] = [round(time.process_time() - cpu, 1), round(time.monotonic() - wall, 1)]
import boto3, psycopg, pydantic_core
result.update(
    machine=platform.machine(),
    python=platform.python_version(),
    psycopg_impl=psycopg.pq.__impl__,
    modules={m.__name__: m.__file__ for m in (psycopg, pydantic_core, boto3)},
    boto3_version=boto3.__version__,
    seconds=seconds,
    process_cpu_s=round(time.process_time(), 1),
    compiled_in_task=compiled_in_task,
)
print("\n" + PREFIX + json.dumps(result), flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_synthesized_asset_runs_on_arm64_python314(
    arm64_root: Path,
    synthesized: SynthesizedAsset,
    runtime_boto3: Path,
    fresh_database: str,
    writer_password_secret: tuple[str, str],
    moto_endpoint: str,
    sqs: Any,
    pipeline_queues: PipelineQueues,
) -> None:
    writer, migrator = synthesized.writer, synthesized.migrator
    # GIVEN the template's platform is the one this root emulates
    for function in (writer, migrator):
        assert function.runtime == f"python{constants.LAMBDA_PYTHON_VERSION}"
        assert function.architectures == ["arm64"]
    secret_arn, password = writer_password_secret
    # The writer logs in as the role the migration creates, with the password it set.
    writer_url = psycopg.conninfo.make_conninfo(
        fresh_database, user="ckpt_writer", password=password
    )
    event = _received_event(
        sqs,
        pipeline_queues,
        [
            (body(job_id="job-arm64", rank=0, world_size=1), "job-arm64:0"),
            ("{not json", "job-arm64:1"),
        ],
    )
    aws = local_aws_env(moto_endpoint)
    # The master secret the migrator reads in AWS (DB_AUTH=secret); DATABASE_URL wins locally.
    master = psycopg.conninfo.conninfo_to_dict(fresh_database)
    master_secret_arn = boto3.client("secretsmanager", region_name="us-east-1").create_secret(
        Name=f"master-arm64-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps(
            {"username": master.get("user"), "password": master.get("password")}
        ),
    )["ARN"]
    spec = {
        "migrator": {
            "env": _function_env(
                migrator,
                "ckpt-migrate-arm64",
                {
                    "DATABASE_URL": fresh_database,
                    "WRITER_PASSWORD_SECRET_ARN": secret_arn,
                    "DB_SECRET_ARN": master_secret_arn,
                },
                aws,
            ),
            # A CDK Trigger invokes the function with an empty payload.
            "event": {},
            "timeout_s": migrator.timeout_s,
        },
        "writer": {
            "env": _function_env(
                writer,
                "ckpt-writer-arm64",
                {"DATABASE_URL": writer_url, "DLQ_URL": pipeline_queues.dlq_url},
                aws,
            ),
            "event": event,
            "timeout_s": writer.timeout_s,
        },
    }
    # One test at a time per root: /var/task and /var/runtime are replaced for this run.
    with (arm64_root / ".ckpt-arm64-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for source, inside in ((synthesized.asset, TASK_ROOT), (runtime_boto3, RUNTIME_DIR)):
            target = arm64_root / inside.lstrip("/")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, symlinks=True)
        # WHEN one arm64 python3.14 process imports and runs both handlers
        result = subprocess.run(
            [CHROOT, str(arm64_root), "/usr/bin/env", "-i",
             *(f"{k}={v}" for k, v in LAMBDA_RUNTIME_ENV.items()),
             PYTHON, "-c", DRIVER.replace("PREFIX", repr(RESULT_PREFIX))],
            input=json.dumps(spec), capture_output=True, text=True, timeout=840, check=False,
        )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-6000:])
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(lines) == 1, result.stdout[-3000:]
    got = json.loads(lines[0].removeprefix(RESULT_PREFIX))
    # For the record (pytest -s / -rP): [CPU s, wall s] per handler, import included.
    print(f"arm64 chroot: {got['seconds']}, process CPU {got['process_cpu_s']} s")

    # THEN it really was aarch64 CPython 3.14, with the asset's compiled wheels and the
    # runtime's boto3
    assert got["machine"] == "aarch64"
    assert got["python"].rpartition(".")[0] == constants.LAMBDA_PYTHON_VERSION
    assert got["psycopg_impl"] == "binary"
    assert got["modules"]["psycopg"].startswith(f"{TASK_ROOT}/psycopg/")
    assert got["modules"]["pydantic_core"].startswith(f"{TASK_ROOT}/pydantic_core/")
    assert got["modules"]["boto3"].startswith(f"{RUNTIME_DIR}/boto3/")
    assert got["boto3_version"] == _boto3_pin()
    # AND every module of the bundle came from its bytecode (infra.bundling.compile_bytecode):
    # nothing was compiled at import, as nothing can be cached in Lambda's read-only /var/task
    assert got["compiled_in_task"] == []
    # AND the migration handler created the schema in the fresh database
    assert got["migrate"] == {"applied": [m.name for m in load_migrations()]}
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'ckpt_writer'"
        ).fetchone()
    assert row is not None and str(row[0]).startswith("SCRAM-SHA-256$")
    # AND the writer acknowledged the whole batch: the report is written, the poison record
    # dead-lettered (through the runtime's boto3, from inside the chroot)
    assert got["writer"] == {"batchItemFailures": []}
    assert checkpoint_rows(fresh_database) == [("job-arm64", 100, 1, 0, 1, 1, True)]
    assert [(s[0], s[2]) for s in shard_rows(fresh_database)] == [("job-arm64", 0)]
    (dead,) = dlq_messages(sqs, pipeline_queues, 1)
    assert dead["Body"] == "{not json"
    assert dead["MessageAttributes"]["ErrorClass"]["StringValue"] == "UndecodableBody"
    # AND the metrics went out as EMF on stdout, as CloudWatch reads them in Lambda
    assert '"RecordsWritten"' in result.stdout
