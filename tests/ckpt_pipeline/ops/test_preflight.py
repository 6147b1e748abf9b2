"""``ckpt-pipeline preflight``: real runs against moto's server over HTTP, plus its pure decisions.

moto (5.2) does not implement Lambda's GetAccountSettings (HTTP 404) and knows only the ``vpc``
Service Quotas, so against it the command must say "could not check" for those and still answer
what moto does know (Region services via SSM's public parameters, VPC quota and count, RDS
proxies). The Lambda concurrency decision itself is exercised on plain values below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from ckpt_pipeline.local.sqs_server import local_aws_env, moto_sqs_server
from ckpt_pipeline.ops.preflight import (
    AccountFacts,
    CountQuota,
    LambdaAccount,
    StackNeeds,
    Unavailable,
    evaluate,
    lambda_concurrency,
    needs_from_context,
    preflight_exit_code,
)
from infra import constants
from infra.settings import load_settings

CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"
REPO_ROOT = Path(__file__).resolve().parents[3]
PREFIXES = ("ok: ", "FAIL: ", "could not check: ", "not checkable: ")


@pytest.fixture(scope="module")
def moto_aws() -> Iterator[str]:
    """A moto server of this module's own: the VPC test fills a Region, nobody else may see it."""
    with moto_sqs_server() as endpoint:
        yield endpoint


def _env(endpoint: str, region: str) -> dict[str, str]:
    env = {**os.environ, **local_aws_env(endpoint)}
    env.update(AWS_REGION=region, AWS_DEFAULT_REGION=region)
    return env


def _preflight(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "preflight", *argv],
        env=env,
        cwd=REPO_ROOT,  # cdk.json is read from the working directory, as cdk does
        capture_output=True,
        text=True,
        timeout=120,
    )


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    lines = result.stdout.strip().splitlines()
    assert lines and all(line.startswith(PREFIXES) for line in lines), result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    return lines


@pytest.mark.slow
def test_against_moto_what_it_cannot_answer_is_said_and_the_rest_passes(moto_aws: str) -> None:
    # GIVEN the default cdk.json (new VPC, new database, reserved concurrency 2) and moto, with
    # the account bootstrapped for CDK
    _bootstrap(moto_aws, "eu-west-1")
    result = _preflight("--allow-unchecked", env=_env(moto_aws, "eu-west-1"))
    # THEN nothing fails, and each question moto lacks is one "could not check" line
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(result)
    assert any(
        line.startswith("could not check: Lambda concurrency: GetAccountSettings answered HTTP 404")
        and "reserved concurrency 2 needs unreserved concurrency >= 102" in line
        for line in lines
    ), lines
    assert any(
        line.startswith("could not check: Lambda concurrent executions quota (lambda L-B99A9384)")
        for line in lines
    ), lines
    assert any(line.startswith("could not check: RDS proxies: ") for line in lines), lines
    assert "ok: VPCs: 1 used + 1 new <= quota 5" in lines
    services = next(line for line in lines if line.startswith("ok: services in eu-west-1: "))
    for service in ("lambda", "sqs", "rds", "secretsmanager", "xray"):
        assert service in services
    assert any(
        line.startswith("not checkable: Lambda runtime python3.14 on arm64") for line in lines
    )


def _bootstrap(endpoint: str, region: str) -> None:
    boto3.client(
        "ssm", endpoint_url=endpoint, region_name=region, **_credentials(endpoint)
    ).put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="27", Type="String")


@pytest.mark.slow
def test_a_full_vpc_quota_fails_and_says_what_to_request(moto_aws: str) -> None:
    # GIVEN a Region whose 5 VPCs (the default one + 4) fill the "VPCs per Region" quota
    region = "eu-west-3"
    ec2 = boto3.client("ec2", endpoint_url=moto_aws, region_name=region, **_credentials(moto_aws))
    existing = len(ec2.describe_vpcs()["Vpcs"])
    for n in range(5 - existing):
        ec2.create_vpc(CidrBlock=f"10.{n}.0.0/16")
    # WHEN the greenfield deploy (which creates a VPC) is checked
    result = _preflight("--allow-unchecked", env=_env(moto_aws, region))
    # THEN it fails, in one line that says what to request
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "FAIL: VPCs: 5 used + 1 new > quota 5: request a 'VPCs per Region' quota"
        " (vpc L-F678F1CE) of >= 6 (or remove unused ones)"
    ) in _lines(result)

    # WHEN the stack goes into an existing VPC (with an existing database: a context the CDK app
    # accepts, read by the same rules) THEN the VPC quota does not matter
    context = {
        "vpcId": "vpc-0123456789abcdef0",
        "availabilityZones": f"{region}a,{region}b",
        "privateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
        "createDatabase": "false",
        "dbInstanceId": "ml-postgres",
        "dbEndpoint": f"ml-postgres.abc123.{region}.rds.amazonaws.com",
        "dbSecurityGroupId": "sg-0123456789abcdef0",
        "dbSecretArn": f"arn:aws:secretsmanager:{region}:123456789012:secret:ml-postgres-AbCdEf",
    }
    options = [arg for key, value in context.items() for arg in ("-c", f"{key}={value}")]
    existing_vpc = _preflight(*options, "--allow-unchecked", env=_env(moto_aws, region))
    # (none of those resources exists: test_preflight_resources names each; exit 1)
    assert existing_vpc.returncode == 1, existing_vpc.stdout + existing_vpc.stderr
    assert not any("VPCs" in line for line in _lines(existing_vpc))


def _credentials(endpoint: str) -> dict[str, str]:
    env = local_aws_env(endpoint)
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


@pytest.mark.slow
def test_an_unreachable_endpoint_is_could_not_check_for_every_aws_question() -> None:
    # GIVEN an endpoint nothing listens on
    result = _preflight(env=_env("http://127.0.0.1:9", "eu-west-1"))
    # THEN no question passes silently: every AWS-backed one is "could not check", and that
    # alone exits 1 (issue 45: it exited 0) unless the operator says --allow-unchecked
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("or pass --allow-unchecked")
    lines = _lines(result)
    assert not any(line.startswith("ok: ") for line in lines), lines
    assert any(line.startswith("could not check: Lambda concurrency: ") for line in lines)
    assert any(line.startswith("could not check: VPCs: ") for line in lines)


@pytest.mark.slow
def test_no_region_is_one_line_and_exit_2(moto_aws: str) -> None:
    env = {
        k: v
        for k, v in _env(moto_aws, "x").items()
        if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")
    }
    env["AWS_CONFIG_FILE"] = "/nonexistent"
    result = _preflight(env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ckpt-pipeline preflight: AWS_REGION: is not set, nor AWS_DEFAULT_REGION, nor a region in"
        " the AWS profile (preflight checks one Region)"
    ]


@pytest.mark.slow
def test_the_region_is_read_where_the_cdk_reads_it(moto_aws: str, tmp_path: Path) -> None:
    # Issue 45: `env -u AWS_DEFAULT_REGION AWS_REGION=eu-west-1 ckpt-pipeline preflight` said
    # "AWS_REGION: is not set". boto3 reads AWS_DEFAULT_REGION and the profile only.
    base = {
        k: v
        for k, v in _env(moto_aws, "x").items()
        if k not in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")
    }
    base["AWS_CONFIG_FILE"] = "/nonexistent"
    only_aws_region = _preflight("--allow-unchecked", env={**base, "AWS_REGION": "eu-west-1"})
    assert any(
        line.startswith("ok: services in eu-west-1: ") for line in _lines(only_aws_region)
    ), only_aws_region.stdout + only_aws_region.stderr
    # The profile's region (boto3's own resolution, as the CDK CLI reads it too)
    config = tmp_path / "config"
    config.write_text("[profile ml]\nregion = eu-central-1\n")
    profile = _preflight(
        "--allow-unchecked", env={**base, "AWS_CONFIG_FILE": str(config), "AWS_PROFILE": "ml"}
    )
    assert any(line.startswith("ok: services in eu-central-1: ") for line in _lines(profile))
    # Two variables that disagree: the CDK would take one, boto3 the other; refused in one line
    both = _preflight(env={**base, "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1"})
    assert both.returncode == 2
    assert both.stderr.strip().splitlines() == [
        "ckpt-pipeline preflight: AWS_REGION: is 'eu-west-1' but AWS_DEFAULT_REGION is"
        " 'us-east-1': the CDK CLI would use the first and boto3 the second; unset one or make"
        " them equal"
    ]


@pytest.mark.slow
def test_a_bad_context_value_names_the_key_and_exits_2(moto_aws: str) -> None:
    result = _preflight("-c", "writerReservedConcurrency=3", env=_env(moto_aws, "eu-west-1"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ckpt-pipeline preflight: context 'writerReservedConcurrency': must be 1 or 2, got '3'"
    ]


# --- the decisions, on plain values -------------------------------------------------------------

NEEDS = StackNeeds(
    reserved_concurrency=2, creates_vpc=True, creates_database=True, high_throughput_fifo=True
)


def _facts(account: LambdaAccount | Unavailable, quota: int | Unavailable = 1000) -> AccountFacts:
    return AccountFacts(
        region="eu-west-1",
        lambda_account=account,
        lambda_quota=quota,
        services=dict.fromkeys(NEEDS.services, True),
        rds_proxies=CountQuota(value=20, used=0),
        rds_instances=CountQuota(value=40, used=3),
        vpcs=CountQuota(value=5, used=1),
    )


def test_a_young_account_with_concurrency_10_fails_and_is_told_the_quota_to_request() -> None:
    findings = lambda_concurrency(NEEDS, _facts(LambdaAccount(10, 10), quota=10))
    assert [f.line() for f in findings] == [
        "FAIL: Lambda concurrency: reserved concurrency 2 needs unreserved >= 102, the account has"
        " 10 unreserved of 10: request a Lambda concurrent executions quota (lambda L-B99A9384)"
        " of >= 102",
        "FAIL: Lambda concurrent executions quota (lambda L-B99A9384): 10 < 102 (reserved 2 + 100"
        " unreserved): request a quota of >= 102",
    ]
    assert preflight_exit_code(evaluate(NEEDS, _facts(LambdaAccount(10, 10), quota=10))) == 1


def test_concurrency_already_reserved_by_other_functions_counts() -> None:
    # 1000 in the account, 899 reserved elsewhere: 101 unreserved - 2 = 99 < 100
    findings = lambda_concurrency(NEEDS, _facts(LambdaAccount(1000, 101)))
    assert findings[0].status == "fail"
    assert findings[0].detail.endswith("quota (lambda L-B99A9384) of >= 1001")
    assert findings[1].status == "ok"  # the quota itself is large enough


def test_a_default_account_passes_with_exactly_100_left() -> None:
    findings = evaluate(NEEDS, _facts(LambdaAccount(1000, 102)))
    assert findings[0].line() == (
        "ok: Lambda concurrency: unreserved 102 - writer's reserved 2 = 100 >= 100"
        " (account concurrency 1000)"
    )
    assert preflight_exit_code(findings) == 0


def test_a_quota_too_small_fails_even_when_the_account_settings_are_unreadable() -> None:
    findings = lambda_concurrency(NEEDS, _facts(Unavailable("AccessDenied"), quota=50))
    assert [f.status for f in findings] == ["unchecked", "fail"]


def test_a_service_missing_in_the_region_fails() -> None:
    facts = _facts(LambdaAccount(1000, 1000))
    facts = AccountFacts(**{**facts.__dict__, "services": {**facts.services, "xray": False}})
    findings = evaluate(NEEDS, facts)
    assert "FAIL: service xray: not offered in eu-west-1: deploy elsewhere" in [
        f.line() for f in findings
    ]
    assert preflight_exit_code(findings) == 1


def test_the_needs_match_what_the_stack_is_synthesized_with() -> None:
    # GIVEN cdk.json's context WHEN read by preflight and by the CDK app's settings THEN they agree
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    needs = needs_from_context(context)
    settings = load_settings(context.get, context.keys())
    assert needs.reserved_concurrency == settings.writer_reserved_concurrency
    assert needs.creates_database == settings.creates_database
    assert needs.creates_vpc == (settings.network is None)
    assert needs.high_throughput_fifo == settings.high_throughput_fifo
    assert needs.runtime == f"python{constants.LAMBDA_PYTHON_VERSION}"
    assert needs.architecture == constants.LAMBDA_ARCHITECTURE
