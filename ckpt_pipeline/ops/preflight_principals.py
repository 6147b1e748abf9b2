"""Preflight's questions about the principals the context names: ``jobPrefixesByPrincipal``'s
keys and ``replayPrincipalId`` are role or user unique ids (AROA…, AIDA…), and each must be a
role or user of the account, or the writer's ownership rules name someone who never sends.

Pure decisions over what IAM listed (:func:`principal_findings`); the listing itself
(:func:`gather_principals`: ListRoles and ListUsers, read-only, paginated) is the one AWS call.
One finding per named principal, its subject the context key, its detail what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_pipeline.ops.preflight import Finding, Unavailable
from ckpt_pipeline.ops.preflight_aws import Clients, reason
from ckpt_pipeline.ops.preflight_resources import PREFIXES_KEY, REPLAY_KEY
from ckpt_stack.settings import PipelineSettings

# How an operator finds a role's unique id (the part of SQS's SenderId before ':').
_HOW = "aws iam get-role --role-name NAME --query Role.RoleId"

# Unique id -> "role NAME" / "user NAME", as IAM listed them.
Principals = Mapping[str, str]


def gather_principals(clients: Clients) -> Principals | Unavailable:
    """Every role's and user's unique id in the account (iam:ListRoles, iam:ListUsers)."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = clients("iam")
    found: dict[str, str] = {}
    try:
        for page in iam.get_paginator("list_roles").paginate():
            found.update({r["RoleId"]: f"role {r['RoleName']}" for r in page["Roles"]})
        for page in iam.get_paginator("list_users").paginate():
            found.update({u["UserId"]: f"user {u['UserName']}" for u in page["Users"]})
    except (ClientError, BotoCoreError) as exc:
        return Unavailable(reason(exc))
    return found


def principal_findings(
    settings: PipelineSettings, known: Principals | Unavailable
) -> list[Finding]:
    """One finding per principal the context names (none when it names none)."""
    named: list[tuple[str, str]] = [(PREFIXES_KEY, p) for p in sorted(settings.job_prefixes or {})]
    if settings.replay_principal_id is not None:
        named.append((REPLAY_KEY, settings.replay_principal_id))
    if not named:
        return []
    if isinstance(known, Unavailable):
        return [
            Finding("unchecked", key, f"{principal}: {known.reason}") for key, principal in named
        ]
    findings = []
    for key, principal in named:
        who = known.get(principal)
        if key == PREFIXES_KEY:
            prefixes = ", ".join((settings.job_prefixes or {})[principal])
            if who is None:
                problem = (
                    f"{principal} (may write {prefixes}) is no role or user of this account: the"
                    " role meant is not listed, so the writer refuses all its reports as"
                    " foreign sender"
                )
            else:
                findings.append(Finding("ok", key, f"{principal} is {who}, may write {prefixes}"))
                continue
        elif who is None:
            problem = (
                f"{principal} is no role or user of this account: the writer refuses every"
                " replay-dlq of another principal's message as foreign sender"
            )
        else:
            findings.append(Finding("ok", key, f"{principal} is {who}"))
            continue
        findings.append(Finding("fail", key, f"{problem}; use the unique id ({_HOW})"))
    return findings
