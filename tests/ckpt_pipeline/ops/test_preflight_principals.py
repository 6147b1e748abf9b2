"""``ckpt-pipeline preflight`` checks the principals the context names against IAM (moto's
server over HTTP: ListRoles and ListUsers answer with each one's unique id)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest

from ckpt_pipeline.local.sqs_server import moto_sqs_server
from ckpt_pipeline.ops.preflight import Finding, Unavailable
from ckpt_pipeline.ops.preflight_principals import principal_findings
from ckpt_stack.context import parse_context
from tests.ckpt_pipeline.ops.test_preflight import (
    _bootstrap,
    _credentials,
    _env,
    _lines,
    _preflight,
)

REGION = "eu-west-1"
ABSENT_ROLE = "AROANOSUCHROLEEXAMPL"
HOW = "; use the unique id (aws iam get-role --role-name NAME --query Role.RoleId)"


@pytest.fixture(scope="module")
def account() -> Iterator[tuple[str, str, str]]:
    """moto with team A's training role and the operators' replay role: (endpoint, role ids).
    (moto's user ids are lower case, not IAM's AIDA…: the context would refuse them.)"""
    with moto_sqs_server() as endpoint:
        iam: Any = boto3.client(
            "iam", endpoint_url=endpoint, region_name=REGION, **_credentials(endpoint)
        )
        trust = json.dumps({"Version": "2012-10-17", "Statement": []})
        team = iam.create_role(RoleName="team-a-train", AssumeRolePolicyDocument=trust)
        replayer = iam.create_role(RoleName="ops-replay", AssumeRolePolicyDocument=trust)
        _bootstrap(endpoint, REGION)
        yield endpoint, team["Role"]["RoleId"], replayer["Role"]["RoleId"]


def _run(endpoint: str, prefixes: dict[str, list[str]], replay: str) -> tuple[int, list[str]]:
    result = _preflight(
        "--allow-unchecked", "-c", f"jobPrefixesByPrincipal={json.dumps(prefixes)}",
        "-c", f"replayPrincipalId={replay}", env=_env(endpoint, REGION),
    )  # fmt: skip
    return result.returncode, _lines(result)


@pytest.mark.slow
def test_principals_that_exist_pass_with_who_they_are(account: tuple[str, str, str]) -> None:
    endpoint, team, replayer = account
    # GIVEN a context naming team A's role for its prefix and the replay role
    code, lines = _run(endpoint, {team: ["teamA-"]}, replayer)
    # THEN each is one ok line saying which role or user it is
    assert code == 0, lines
    assert f"ok: jobPrefixesByPrincipal: {team} is role team-a-train, may write teamA-" in lines
    assert f"ok: replayPrincipalId: {replayer} is role ops-replay" in lines


@pytest.mark.slow
def test_each_principal_iam_does_not_know_is_one_line_saying_what_is_wrong(
    account: tuple[str, str, str],
) -> None:
    endpoint, team, _ = account
    # GIVEN a context naming a role id no role has, for prefixes and for replays
    code, lines = _run(endpoint, {team: ["teamA-"], ABSENT_ROLE: ["teamB-", "b/"]}, ABSENT_ROLE)
    # THEN the deploy is refused, one FAIL line per problem, and the role that exists still passes
    assert code == 1
    assert [line for line in lines if line.startswith("FAIL: ")] == [
        f"FAIL: jobPrefixesByPrincipal: {ABSENT_ROLE} (may write teamB-, b/) is no role or user"
        " of this account: the role meant is not listed, so the writer refuses all its reports"
        f" as foreign sender{HOW}",
        f"FAIL: replayPrincipalId: {ABSENT_ROLE} is no role or user of this account: the writer"
        f" refuses every replay-dlq of another principal's message as foreign sender{HOW}",
    ]
    assert any(line.startswith(f"ok: jobPrefixesByPrincipal: {team} is role") for line in lines)


def test_iam_unanswered_is_one_unchecked_line_per_principal() -> None:
    plain = parse_context(lambda _key: None)
    settings = replace(plain, job_prefixes={ABSENT_ROLE: ("teamB-",)})
    denied = Unavailable("ListRoles: AccessDenied")
    assert principal_findings(settings, denied) == [
        Finding("unchecked", "jobPrefixesByPrincipal", f"{ABSENT_ROLE}: ListRoles: AccessDenied")
    ]
    assert principal_findings(plain, denied) == []
