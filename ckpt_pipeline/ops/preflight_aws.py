"""The AWS side of ``ckpt-pipeline preflight``: read-only calls that fill :class:`AccountFacts`.

Every question is asked on its own; an error (access denied, an endpoint that does not implement
the call, no network) becomes :class:`Unavailable` with a one-line reason, so one missing answer
never hides the others. Nothing here is created or changed.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import boto3

from ckpt_pipeline.aws_region import require_region
from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.ops.preflight import (
    LAMBDA_CONCURRENCY_QUOTA,
    RDS_INSTANCES_QUOTA_NAME,
    RDS_PROXIES_QUOTA_NAME,
    VPCS_PER_REGION_QUOTA,
    AccountFacts,
    CountQuota,
    LambdaAccount,
    StackNeeds,
    Unavailable,
    evaluate,
    load_context,
    needs_from_context,
    preflight_exit_code,
    settings_from_context,
)

T = TypeVar("T")
Clients = Callable[[str], Any]

_SSM_SERVICE = "/aws/service/global-infrastructure/regions/{region}/services/{service}"


def aws_region() -> str:
    """The Region ``cdk deploy`` would use (:mod:`ckpt_pipeline.aws_region`); preflight answers
    for exactly one Region."""
    region = require_region(because="preflight checks one Region")
    # Without credentials every question would come back unanswered: one line instead.
    if boto3.session.Session().get_credentials() is None:
        raise ConfigError("AWS credentials", "none found (preflight reads the account)")
    return region


def client_factory(region: str) -> Clients:
    """boto3 clients for ``region`` with short timeouts: a preflight should answer in seconds."""
    from botocore.config import Config

    config = Config(
        connect_timeout=5, read_timeout=10, retries={"total_max_attempts": 2, "mode": "standard"}
    )
    return lambda service: boto3.client(service, region_name=region, config=config)


def reason(exc: Exception) -> str:
    """One line saying why an AWS call got no answer."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "error"))
        message = str(error.get("Message", "")).strip()
        operation = exc.operation_name
        if code.isdigit():
            # An HTTP status with an HTML page as the message: the endpoint lacks the call.
            return f"{operation} answered HTTP {code} (not implemented by this endpoint?)"
        first = message.splitlines()[0] if message else ""
        return f"{operation}: {code}" + (f": {first}" if first else "")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _ask(question: Callable[[], T]) -> T | Unavailable:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return question()
    except (BotoCoreError, ClientError) as exc:
        return Unavailable(reason(exc))


def _count(pages: Iterable[dict[str, Any]], key: str) -> int:
    return sum(len(page.get(key, [])) for page in pages)


def _lambda_account(clients: Clients) -> LambdaAccount:
    limit = clients("lambda").get_account_settings()["AccountLimit"]
    return LambdaAccount(
        concurrent_executions=int(limit["ConcurrentExecutions"]),
        unreserved_concurrent_executions=int(limit["UnreservedConcurrentExecutions"]),
    )


def _quota_value(clients: Clients, service_code: str, quota_code: str) -> int:
    quota = clients("service-quotas").get_service_quota(
        ServiceCode=service_code, QuotaCode=quota_code
    )["Quota"]
    return int(quota["Value"])


def _service_offered(clients: Clients, region: str, service: str) -> bool:
    ssm = clients("ssm")
    try:
        ssm.get_parameter(Name=_SSM_SERVICE.format(region=region, service=service))
    except ssm.exceptions.ParameterNotFound:
        return False
    return True


def _rds_quotas(clients: Clients) -> dict[str, int]:
    paginator = clients("service-quotas").get_paginator("list_service_quotas")
    return {
        str(q["QuotaName"]): int(q["Value"])
        for page in paginator.paginate(ServiceCode="rds")
        for q in page.get("Quotas", [])
    }


def _rds_count(
    clients: Clients, quotas: dict[str, int] | Unavailable, name: str, operation: str, key: str
) -> CountQuota | Unavailable:
    if isinstance(quotas, Unavailable):
        return quotas
    if name not in quotas:
        return Unavailable(f"ListServiceQuotas (rds) has no quota named {name!r}")
    value = quotas[name]
    used = _ask(lambda: _count(clients("rds").get_paginator(operation).paginate(), key))
    return used if isinstance(used, Unavailable) else CountQuota(value=value, used=used)


def _vpcs(clients: Clients) -> CountQuota | Unavailable:
    value = _ask(lambda: _quota_value(clients, *VPCS_PER_REGION_QUOTA))
    if isinstance(value, Unavailable):
        return value
    used = _ask(lambda: _count(clients("ec2").get_paginator("describe_vpcs").paginate(), "Vpcs"))
    return used if isinstance(used, Unavailable) else CountQuota(value=value, used=used)


def gather_facts(needs: StackNeeds, region: str, clients: Clients) -> AccountFacts:
    """Ask the account every question ``needs`` raises; read-only."""
    rds_quotas = _ask(lambda: _rds_quotas(clients))
    return AccountFacts(
        region=region,
        lambda_account=_ask(lambda: _lambda_account(clients)),
        lambda_quota=_ask(lambda: _quota_value(clients, *LAMBDA_CONCURRENCY_QUOTA)),
        services={
            service: _ask(functools.partial(_service_offered, clients, region, service))
            for service in needs.services
        },
        rds_proxies=_rds_count(
            clients, rds_quotas, RDS_PROXIES_QUOTA_NAME, "describe_db_proxies", "DBProxies"
        ),
        rds_instances=(
            _rds_count(
                clients,
                rds_quotas,
                RDS_INSTANCES_QUOTA_NAME,
                "describe_db_instances",
                "DBInstances",
            )
            if needs.creates_database
            else None
        ),
        vpcs=_vpcs(clients) if needs.creates_vpc else None,
    )


def main_preflight(args: argparse.Namespace) -> int:
    """``ckpt-pipeline preflight``: one line per finding; exit 1 when the deploy would fail, or
    when a question went unanswered and ``--allow-unchecked`` was not given."""
    from ckpt_pipeline.ops.preflight_lookup import gather_referenced
    from ckpt_pipeline.ops.preflight_principals import gather_principals, principal_findings
    from ckpt_pipeline.ops.preflight_resources import (
        BOOTSTRAP_QUALIFIER_KEY,
        DEFAULT_BOOTSTRAP_QUALIFIER,
        evaluate_referenced,
    )

    context = load_context(Path(args.cdk_json) if args.cdk_json else None, args.context or [])
    settings = settings_from_context(context)
    needs = needs_from_context(context)
    region = aws_region()
    clients = client_factory(region)
    qualifier = str(context.get(BOOTSTRAP_QUALIFIER_KEY) or DEFAULT_BOOTSTRAP_QUALIFIER)
    findings = evaluate(needs, gather_facts(needs, region, clients))
    findings += evaluate_referenced(
        settings, gather_referenced(settings, clients, qualifier=qualifier), qualifier=qualifier
    )
    if settings.job_prefixes or settings.replay_principal_id:
        findings += principal_findings(settings, gather_principals(clients))
    for finding in findings:
        print(finding.line())
    code = preflight_exit_code(findings, allow_unchecked=args.allow_unchecked)
    unchecked = sum(f.status == "unchecked" for f in findings)
    if unchecked and not args.allow_unchecked:
        print(
            f"ckpt-pipeline preflight: {unchecked} question(s) could not be checked: grant the"
            " read-only calls (docs/deploy.md#prerequisites) or pass --allow-unchecked",
            file=sys.stderr,
        )
    return code
