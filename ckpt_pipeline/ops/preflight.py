"""``ckpt-pipeline preflight``: would ``cdk deploy`` fail in this account and Region, and why?

Pure decisions only: what the stack needs (:class:`StackNeeds`), what the account answered
(:class:`AccountFacts`, gathered by :mod:`ckpt_pipeline.ops.preflight_aws`), and one
:class:`Finding` per question. Anything the account did not answer is a finding of its own
("could not check …"), never a silent pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ckpt_pipeline.exceptions import ConfigError
from ckpt_stack.context import parse_context
from ckpt_stack.exceptions import ContextError
from ckpt_stack.settings import PipelineSettings

# "You can reserve up to the Unreserved account concurrency value that is shown, minus 100 for
# functions that don't have reserved concurrency" — PutFunctionConcurrency fails with "decreases
# account's UnreservedConcurrentExecution below its minimum value of [100]" otherwise
# (https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html).
MIN_UNRESERVED_CONCURRENCY = 100

# Service Quotas codes. Lambda's "Concurrent executions" is the account concurrency
# (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html); "VPCs per Region"
# (https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html).
LAMBDA_CONCURRENCY_QUOTA = ("lambda", "L-B99A9384")
VPCS_PER_REGION_QUOTA = ("vpc", "L-F678F1CE")
# RDS quotas are found by name in ServiceCode "rds" (names as in
# https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/CHAP_Limits.html).
RDS_PROXIES_QUOTA_NAME = "Proxies"
RDS_INSTANCES_QUOTA_NAME = "DB instances"

# Regional availability as AWS publishes it in the SSM public parameters
# /aws/service/global-infrastructure/regions/<region>/services/<service>.
BASE_SERVICES = ("lambda", "sqs", "rds", "secretsmanager", "ec2", "logs", "cloudwatch", "sns")
TRACING_SERVICE = "xray"

# unchecked: the account did not answer (access denied, no endpoint): fatal unless
# --allow-unchecked. not-checkable: no API answers the question at all: reported, never fatal.
Status = Literal["ok", "fail", "unchecked", "not-checkable"]
_PREFIX: dict[Status, str] = {
    "ok": "ok",
    "fail": "FAIL",
    "unchecked": "could not check",
    "not-checkable": "not checkable",
}


@dataclass(frozen=True)
class Finding:
    """One answer: ``ok``, ``fail`` (the deploy would fail; says what to request) or unchecked."""

    status: Status
    subject: str
    detail: str

    def line(self) -> str:
        """The one output line of this finding."""
        return f"{_PREFIX[self.status]}: {self.subject}: {self.detail}"


@dataclass(frozen=True)
class Unavailable:
    """The account (or the endpoint) did not answer a question; ``reason`` says what it said."""

    reason: str


@dataclass(frozen=True)
class LambdaAccount:
    """GetAccountSettings' AccountLimit: the account concurrency and what is still unreserved."""

    concurrent_executions: int
    unreserved_concurrent_executions: int


@dataclass(frozen=True)
class CountQuota:
    """A quota and how much of it is in use."""

    value: int
    used: int


@dataclass(frozen=True)
class StackNeeds:
    """What one deploy of the stack asks of the account (from cdk.json context plus ``-c``)."""

    reserved_concurrency: int
    creates_vpc: bool
    creates_database: bool
    high_throughput_fifo: bool
    tracing: bool = True
    runtime: str = "python3.14"
    architecture: str = "arm64"

    @property
    def services(self) -> tuple[str, ...]:
        """The services the stack's resources belong to."""
        return BASE_SERVICES + ((TRACING_SERVICE,) if self.tracing else ())


@dataclass(frozen=True)
class AccountFacts:
    """Everything the account and Region answered (or did not)."""

    region: str
    lambda_account: LambdaAccount | Unavailable
    lambda_quota: int | Unavailable
    # service -> offered in the Region (False: not offered; Unavailable: no answer)
    services: Mapping[str, bool | Unavailable]
    rds_proxies: CountQuota | Unavailable
    rds_instances: CountQuota | Unavailable | None  # None: the stack creates no instance
    vpcs: CountQuota | Unavailable | None  # None: the stack creates no VPC


def settings_from_context(context: Mapping[str, object]) -> PipelineSettings:
    """The stack's settings from this CDK context, by the rules the CDK app applies
    (``ckpt_stack.context``): a context ``cdk synth`` would refuse is refused here."""
    try:
        return parse_context(context.get, context.keys())
    except ContextError as exc:
        raise ConfigError(f"context {exc.name!r}", exc.rule) from None


def needs_from_context(context: Mapping[str, object]) -> StackNeeds:
    """The needs of a deploy with this CDK context (:func:`settings_from_context`)."""
    settings = settings_from_context(context)
    return StackNeeds(
        reserved_concurrency=settings.writer_reserved_concurrency,
        creates_vpc=settings.network is None,
        creates_database=settings.creates_database,
        high_throughput_fifo=settings.high_throughput_fifo,
    )


def load_context(cdk_json: Path | None, overrides: Sequence[str]) -> dict[str, object]:
    """cdk.json's ``context`` (when the file exists) with ``key=value`` overrides, as cdk does."""
    context: dict[str, object] = {}
    if cdk_json is not None and cdk_json.is_file():
        try:
            loaded = json.loads(cdk_json.read_text()).get("context", {})
        except (ValueError, AttributeError) as exc:
            raise ConfigError(
                str(cdk_json), f"must be a JSON object with 'context': {exc}"
            ) from exc
        if isinstance(loaded, dict):
            context.update(loaded)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("-c", f"must be key=value, got {item!r}")
        context[key.strip()] = value
    return context


def lambda_concurrency(needs: StackNeeds, facts: AccountFacts) -> list[Finding]:
    """Can the writer reserve its concurrency and leave the 100 unreserved Lambda insists on?"""
    reserved = needs.reserved_concurrency
    least_quota = MIN_UNRESERVED_CONCURRENCY + reserved
    code = f"{LAMBDA_CONCURRENCY_QUOTA[0]} {LAMBDA_CONCURRENCY_QUOTA[1]}"
    findings: list[Finding] = []
    account, quota = facts.lambda_account, facts.lambda_quota
    subject = "Lambda concurrency"
    if isinstance(account, LambdaAccount):
        left = account.unreserved_concurrent_executions - reserved
        if left >= MIN_UNRESERVED_CONCURRENCY:
            findings.append(
                Finding(
                    "ok",
                    subject,
                    f"unreserved {account.unreserved_concurrent_executions} - writer's reserved"
                    f" {reserved} = {left} >= {MIN_UNRESERVED_CONCURRENCY}"
                    f" (account concurrency {account.concurrent_executions})",
                )
            )
        else:
            short = MIN_UNRESERVED_CONCURRENCY - left
            findings.append(
                Finding(
                    "fail",
                    subject,
                    f"reserved concurrency {reserved} needs unreserved >= {least_quota}, the"
                    f" account has {account.unreserved_concurrent_executions} unreserved of"
                    f" {account.concurrent_executions}: request a Lambda concurrent executions"
                    f" quota ({code}) of >= {account.concurrent_executions + short}",
                )
            )
    else:
        findings.append(
            Finding(
                "unchecked",
                subject,
                f"{account.reason}; reserved concurrency {reserved} needs"
                f" unreserved concurrency >= {least_quota}",
            )
        )
    quota_subject = f"Lambda concurrent executions quota ({code})"
    if isinstance(quota, Unavailable):
        findings.append(Finding("unchecked", quota_subject, quota.reason))
    elif quota < least_quota:
        findings.append(
            Finding(
                "fail",
                quota_subject,
                f"{quota} < {least_quota} (reserved {reserved} + {MIN_UNRESERVED_CONCURRENCY}"
                f" unreserved): request a quota of >= {least_quota}",
            )
        )
    else:
        findings.append(Finding("ok", quota_subject, f"{quota} >= {least_quota}"))
    return findings


def services_offered(needs: StackNeeds, facts: AccountFacts) -> list[Finding]:
    """Is every service the stack uses offered in the Region?"""
    offered: list[str] = []
    findings: list[Finding] = []
    for service in needs.services:
        answer = facts.services.get(service, Unavailable("not asked"))
        if answer is True:
            offered.append(service)
        elif answer is False:
            findings.append(
                Finding(
                    "fail", f"service {service}", f"not offered in {facts.region}: deploy elsewhere"
                )
            )
        else:
            assert isinstance(answer, Unavailable)
            findings.append(
                Finding("unchecked", f"service {service} in {facts.region}", answer.reason)
            )
    if offered:
        findings.insert(
            0, Finding("ok", f"services in {facts.region}", ", ".join(offered) + " offered")
        )
    return findings


def count_quota(
    subject: str, answer: CountQuota | Unavailable | None, *, adds: int, request: str
) -> list[Finding]:
    """Does a quota leave room for the ``adds`` resources the stack creates?"""
    if answer is None:
        return []
    if isinstance(answer, Unavailable):
        return [Finding("unchecked", subject, answer.reason)]
    if answer.used + adds <= answer.value:
        return [Finding("ok", subject, f"{answer.used} used + {adds} new <= quota {answer.value}")]
    return [
        Finding(
            "fail",
            subject,
            f"{answer.used} used + {adds} new > quota {answer.value}: request {request} of"
            f" >= {answer.used + adds} (or remove unused ones)",
        )
    ]


def not_checkable(needs: StackNeeds, region: str) -> list[Finding]:
    """What no API answers; said so, so that nobody reads silence as a pass."""
    findings = [
        Finding(
            "not-checkable",
            f"Lambda runtime {needs.runtime} on {needs.architecture} in {region}",
            "no Lambda API lists a Region's runtimes or architectures; CreateFunction would"
            " refuse them (https://docs.aws.amazon.com/lambda/latest/dg/lambda-runtimes.html)",
        )
    ]
    if needs.high_throughput_fifo:
        findings.append(
            Finding(
                "not-checkable",
                f"high-throughput FIFO throughput in {region}",
                "SQS documents it per Region and exposes no quota API; the stack works in any"
                " Region with FIFO queues, only the throughput ceiling differs"
                " (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/"
                "high-throughput-fifo.html)",
            )
        )
    return findings


def evaluate(needs: StackNeeds, facts: AccountFacts) -> list[Finding]:
    """Every finding, in a stable order: concurrency first (what bites first), then the rest."""
    return [
        *lambda_concurrency(needs, facts),
        *services_offered(needs, facts),
        *count_quota(
            "RDS proxies",
            facts.rds_proxies,
            adds=1,
            request=f"an RDS '{RDS_PROXIES_QUOTA_NAME}' quota",
        ),
        *count_quota(
            "RDS DB instances",
            facts.rds_instances,
            adds=1,
            request=f"an RDS '{RDS_INSTANCES_QUOTA_NAME}' quota",
        ),
        *count_quota(
            "VPCs",
            facts.vpcs,
            adds=1,
            request=f"a 'VPCs per Region' quota ({' '.join(VPCS_PER_REGION_QUOTA)})",
        ),
        *not_checkable(needs, facts.region),
    ]


def preflight_exit_code(findings: Sequence[Finding], *, allow_unchecked: bool = False) -> int:
    """1 when any finding says the deploy would fail, or a question the account could answer went
    unanswered (unless ``allow_unchecked``: an operator who cannot grant Describe* says so)."""
    if any(f.status == "fail" for f in findings):
        return 1
    if not allow_unchecked and any(f.status == "unchecked" for f in findings):
        return 1
    return 0
