"""``ckpt-pipeline preflight`` checks what the context names, against moto's server over HTTP.

moto (5.2) answers every call these checks make (EC2 DescribeVpcs/Subnets/SecurityGroups, RDS
DescribeDBInstances, Secrets Manager DescribeSecret/GetSecretValue, SSM GetParameter). What it
cannot answer is Lambda's GetAccountSettings (HTTP 404) and the Lambda and RDS Service Quotas:
those stay "could not check" here, so these runs pass ``--allow-unchecked`` where they must
reach exit 0, and one run shows that without it the unanswered questions alone exit 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from ckpt_pipeline.local.sqs_server import moto_sqs_server
from ckpt_pipeline.ops.preflight import Finding, preflight_exit_code
from ckpt_pipeline.ops.preflight_resources import (
    DbInstance,
    ReferencedFacts,
    database,
)
from ckpt_stack.settings import ExistingDatabase, ExistingNetwork
from tests.ckpt_pipeline.ops.test_preflight import _credentials, _env, _lines, _preflight

REGION = "eu-west-2"
EMPTY_REGION = "eu-north-1"  # nothing created there
WHAT_TO_DO = ": check the id, and the credentials' account and Region"
# The issue's example: a context naming resources none of which exist.
ABSENT = {
    "createDatabase": "false",
    "vpcId": "vpc-0123456789abcdef0",
    "availabilityZones": f"{EMPTY_REGION}a,{EMPTY_REGION}b",
    "privateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
    "dbInstanceId": "ml-postgres",
    "dbEndpoint": f"ml-postgres.abc123.{EMPTY_REGION}.rds.amazonaws.com",
    "dbSecurityGroupId": "sg-0123456789abcdef0",
    "dbSecretArn": f"arn:aws:secretsmanager:{EMPTY_REGION}:123456789012:secret:ml-postgres-AbCdEf",
}


@dataclass(frozen=True)
class Account:
    endpoint: str
    context: dict[str, str]  # names what exists, as an operator would pass it

    def client(self, service: str) -> Any:
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=REGION, **_credentials(self.endpoint)
        )

    def run(self, overrides: dict[str, str], *extra: str, region: str = REGION) -> Any:
        options = [a for k, v in {**self.context, **overrides}.items() for a in ("-c", f"{k}={v}")]
        return _preflight(*options, *extra, env=_env(self.endpoint, region))


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    """moto with what the existing-VPC/DB example names: a VPC, subnets in two zones, the
    database's group, PostgreSQL 16 behind it, its master secret, a CDK bootstrap."""
    with moto_sqs_server() as endpoint:
        acct = Account(endpoint, {})
        ec2 = acct.client("ec2")
        vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        subnets = [
            ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{n}.0/24", AvailabilityZone=az)["Subnet"][
                "SubnetId"
            ]
            for n, az in ((1, f"{REGION}a"), (2, f"{REGION}b"))
        ]
        group = ec2.create_security_group(GroupName="db", Description="db", VpcId=vpc)["GroupId"]
        rds = acct.client("rds")
        rds.create_db_subnet_group(
            DBSubnetGroupName="ml", DBSubnetGroupDescription="ml", SubnetIds=subnets
        )
        for name, version in (("ml-postgres", "16.4"), ("old-postgres", "13.16")):
            rds.create_db_instance(
                DBInstanceIdentifier=name, Engine="postgres", EngineVersion=version,
                DBInstanceClass="db.t4g.micro", MasterUsername="mladmin",
                MasterUserPassword="x" * 16, DBSubnetGroupName="ml",
                VpcSecurityGroupIds=[group], AllocatedStorage=20,
            )  # fmt: skip
        address = rds.describe_db_instances(DBInstanceIdentifier="ml-postgres")["DBInstances"][0][
            "Endpoint"
        ]["Address"]
        secrets = acct.client("secretsmanager")
        secret = secrets.create_secret(
            Name="ml-postgres-master",
            SecretString=json.dumps({"username": "mladmin", "password": "x" * 16}),
        )["ARN"]
        acct.client("ssm").put_parameter(
            Name="/cdk-bootstrap/hnb659fds/version", Value="27", Type="String"
        )
        acct.context.update(
            createDatabase="false", vpcId=vpc, availabilityZones=f"{REGION}a,{REGION}b",
            privateSubnetIds=",".join(subnets), dbInstanceId="ml-postgres", dbEndpoint=address,
            dbSecurityGroupId=group, dbSecretArn=secret, dbMasterUsername="mladmin",
        )  # fmt: skip
        yield acct


@pytest.mark.slow
def test_what_exists_and_fits_passes(account: Account) -> None:
    result = account.run({}, "--allow-unchecked")
    lines = _lines(result)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: CDK bootstrap (/cdk-bootstrap/hnb659fds/version): version 27 >= 6" in lines
    assert f"ok: vpcId: {account.context['vpcId']} exists" in lines
    assert any(line.startswith("ok: privateSubnetIds: 2 subnets of") for line in lines), lines
    assert any(
        line.startswith("ok: dbInstanceId: ml-postgres: PostgreSQL 16.4 (available)")
        for line in lines
    ), lines
    assert "ok: dbSecretArn: JSON with username and password (mladmin)" in lines


@pytest.mark.slow
def test_moto_cannot_answer_lambda_and_rds_quotas_so_without_allow_unchecked_it_exits_1(
    account: Account,
) -> None:
    result = account.run({})
    lines = _lines(result)
    assert not any(line.startswith("FAIL: ") for line in lines), lines
    # What moto does not implement (named as such, module docstring): unanswered, not passed.
    assert any(line.startswith("could not check: Lambda concurrency: ") for line in lines), lines
    assert result.returncode == 1
    assert "--allow-unchecked" in result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_issues_example_names_every_missing_resource_and_exits_1(account: Account) -> None:
    # GIVEN the existing-VPC/DB example of issue 45, none of whose resources exist
    result = account.run(ABSENT, "--allow-unchecked", region=EMPTY_REGION)
    lines = _lines(result)
    # THEN one line per missing resource, naming the context key, and exit 1
    assert result.returncode == 1, result.stdout
    expected = [
        "FAIL: CDK bootstrap (/cdk-bootstrap/hnb659fds/version): not bootstrapped: run `npx cdk"
        " bootstrap` once for this account and Region",
        "FAIL: vpcId: vpc-0123456789abcdef0 does not exist in this account and Region"
        " (InvalidVpcID.NotFound)" + WHAT_TO_DO,
        "FAIL: privateSubnetIds: subnet-0123456789abcdef0 does not exist in this account and"
        " Region (InvalidSubnetID.NotFound)" + WHAT_TO_DO,
        "FAIL: privateSubnetIds: subnet-0123456789abcdef1 does not exist in this account and"
        " Region (InvalidSubnetID.NotFound)" + WHAT_TO_DO,
        "FAIL: dbSecurityGroupId: sg-0123456789abcdef0 does not exist in this account and"
        " Region (InvalidGroup.NotFound)" + WHAT_TO_DO,
        "FAIL: dbInstanceId: ml-postgres does not exist in this account and Region"
        " (DBInstanceNotFound)" + WHAT_TO_DO,
        f"FAIL: dbSecretArn: {ABSENT['dbSecretArn']} does not exist in this account and Region"
        " (ResourceNotFoundException)" + WHAT_TO_DO,
    ]
    assert [line for line in lines if line.startswith("FAIL: ")] == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        # subnets listed against the zones in the wrong order
        ({"availabilityZones": f"{REGION}b,{REGION}a"}, "FAIL: availabilityZones: "),
        ({"dbInstanceId": "old-postgres"}, "FAIL: dbInstanceId: old-postgres runs PostgreSQL"
         " 13.16: the migrations need 15 or later"),
        ({"dbEndpoint": f"other.abc.{REGION}.rds.amazonaws.com"}, "FAIL: dbEndpoint: "),
        ({"dbPort": "6543"}, "FAIL: dbPort: 6543, but ml-postgres listens on 5432"),
        ({"dbMasterUsername": "postgres"}, "FAIL: dbMasterUsername: is 'postgres' but the"
         " secret's username is 'mladmin'"),
    ],
)  # fmt: skip
def test_a_resource_that_exists_but_does_not_fit_is_named(
    account: Account, overrides: dict[str, str], line: str
) -> None:
    result = account.run(overrides, "--allow-unchecked")
    assert result.returncode == 1, result.stdout
    assert any(line.startswith(line) for line in _lines(result)), (line, result.stdout)


@pytest.mark.slow
def test_a_subnet_of_another_vpc_and_a_group_of_another_vpc_are_named(account: Account) -> None:
    ec2 = account.client("ec2")
    other = ec2.create_vpc(CidrBlock="10.10.0.0/16")["Vpc"]["VpcId"]
    stray = ec2.create_subnet(VpcId=other, CidrBlock="10.10.1.0/24", AvailabilityZone=f"{REGION}b")
    group = ec2.create_security_group(GroupName="x", Description="x", VpcId=other)["GroupId"]
    first = account.context["privateSubnetIds"].split(",")[0]
    result = account.run(
        {"privateSubnetIds": f"{first},{stray['Subnet']['SubnetId']}", "dbSecurityGroupId": group},
        "--allow-unchecked",
    )
    lines = _lines(result)
    assert result.returncode == 1
    assert any(
        line.startswith("FAIL: privateSubnetIds: ") and "not in vpcId" in line for line in lines
    )
    assert any(
        line.startswith(f"FAIL: dbSecurityGroupId: {group} belongs to {other}") for line in lines
    )
    assert any(
        line.startswith(f"FAIL: dbSecurityGroupId: {group} is not attached") for line in lines
    )


@pytest.mark.slow
def test_a_secret_without_a_password_and_a_missing_bootstrap_are_named(account: Account) -> None:
    secrets = account.client("secretsmanager")
    bare = secrets.create_secret(Name="bare", SecretString=json.dumps({"username": "mladmin"}))
    ssm = account.client("ssm")
    ssm.delete_parameter(Name="/cdk-bootstrap/hnb659fds/version")
    try:
        result = account.run({"dbSecretArn": bare["ARN"]}, "--allow-unchecked")
    finally:
        ssm.put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="27", Type="String")
    lines = _lines(result)
    assert result.returncode == 1
    assert (
        "FAIL: CDK bootstrap (/cdk-bootstrap/hnb659fds/version): not bootstrapped: run `npx cdk"
        " bootstrap` once for this account and Region"
    ) in lines
    assert any(
        line.startswith("FAIL: dbSecretArn: must be a JSON object with string 'username' and")
        and "['username']" in line
        for line in lines
    ), lines
    assert "x" * 16 not in result.stdout + result.stderr  # never a secret value


@pytest.mark.slow
def test_a_secret_under_a_customer_key_needs_dbsecretkmskeyarn(account: Account) -> None:
    key = account.client("kms").create_key(Description="ml-postgres secret")["KeyMetadata"]["Arn"]
    secret = account.client("secretsmanager").create_secret(
        Name="ml-postgres-cmk",
        SecretString=json.dumps({"username": "mladmin", "password": "x" * 16}),
        KmsKeyId=key,
    )["ARN"]
    without = account.run({"dbSecretArn": secret}, "--allow-unchecked")
    assert without.returncode == 1
    assert any(
        line.startswith(
            f"FAIL: dbSecretKmsKeyArn: is not set, but the secret is encrypted with {key}"
        )
        for line in _lines(without)
    ), without.stdout
    named = account.run({"dbSecretArn": secret, "dbSecretKmsKeyArn": key}, "--allow-unchecked")
    assert named.returncode == 0, named.stdout


# --- decisions moto cannot reach (plain values): an Aurora instance needs a cluster there ---

NET = ExistingNetwork(
    "vpc-0aaaaaaaaaaaaaaa1", ("eu-west-1a", "eu-west-1b"), ("subnet-0a", "subnet-0b")
)
DB = ExistingDatabase("ml", "ml.x.eu-west-1.rds.amazonaws.com", 5432, "sg-0a", "arn:secret", None)


def test_an_aurora_instance_is_refused() -> None:
    facts = ReferencedFacts(
        bootstrap_version=27,
        db_instance=DbInstance("aurora-postgresql", "16.4", DB.endpoint, 5432, NET.vpc_id,
                               ("sg-0a",), "available"),
    )  # fmt: skip
    [finding] = database(DB, NET, facts)
    assert (finding.status, finding.subject) == ("fail", "dbInstanceId")
    assert finding.detail.endswith("the stack needs RDS for PostgreSQL (engine postgres)")


def test_unchecked_is_fatal_unless_allowed() -> None:
    findings = [Finding("ok", "a", "b"), Finding("unchecked", "c", "AccessDenied")]
    assert preflight_exit_code(findings) == 1
    assert preflight_exit_code(findings, allow_unchecked=True) == 0
    assert preflight_exit_code([Finding("not-checkable", "runtime", "no API")]) == 0
