"""Shared synthesized templates: one per configuration, built once per test session."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import assertions
from cdk_nag import AwsSolutionsChecks

from infra.settings import PipelineSettings, load_settings
from infra.stack import CheckpointPipelineStack

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONTEXT: dict[str, Any] = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]

EXISTING_CONTEXT: dict[str, Any] = {
    "prefix": "mlteam",
    "createDatabase": False,
    "vpcId": "vpc-0123456789abcdef0",
    "availabilityZones": ["eu-west-1a", "eu-west-1b"],
    "privateSubnetIds": "subnet-0aaaaaaaaaaaaaaa1,subnet-0bbbbbbbbbbbbbbb2",
    "dbInstanceId": "ml-postgres",
    "dbEndpoint": "ml-postgres.abc123xyz.eu-west-1.rds.amazonaws.com",
    "dbPort": "5432",
    "dbSecurityGroupId": "sg-0123456789abcdef0",
    "dbSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:ml-postgres-master-AbCdEf",
    "dbMasterUsername": "mladmin",
    "dbName": "ml",
    "writerReservedConcurrency": "1",
    "alarmEmail": "ml-ops@example.com",
    "highThroughputFifo": "false",
    "replayPrincipalId": "AROAOPSREPLAYEXAMPLE1",
    "jobPrefixesByPrincipal": '{"AROATEAMAROLEEXAMPLE": ["teamA-"], "AROATEAMBROLEEXAMPLE": "b/"}',
}


@dataclass(frozen=True)
class Synth:
    """A synthesized stack with its template and its annotations (cdk-nag findings included)."""

    settings: PipelineSettings
    stack: CheckpointPipelineStack
    template: assertions.Template

    @property
    def json(self) -> Mapping[str, Any]:
        return self.template.to_json()  # type: ignore[no-any-return]

    def resources(self, cfn_type: str) -> dict[str, Mapping[str, Any]]:
        return dict(self.template.find_resources(cfn_type))

    def only(self, cfn_type: str) -> Mapping[str, Any]:
        found = self.resources(cfn_type)
        assert len(found) == 1, f"expected one {cfn_type}, found {list(found)}"
        return next(iter(found.values()))

    def messages(self, level: str) -> list[str]:
        annotations = assertions.Annotations.from_stack(self.stack)
        finder = annotations.find_error if level == "error" else annotations.find_warning
        return [f"{m.id}: {m.entry.data}" for m in finder("*", assertions.Match.any_value())]


def synthesize(overrides: Mapping[str, Any], tmp: Path) -> Synth:
    """Synthesize with cdk.json's context plus ``overrides``, skipping asset bundling."""
    context = {**DEFAULT_CONTEXT, **overrides, "aws:cdk:bundling-stacks": []}
    app = cdk.App(context=context, outdir=str(tmp))
    settings = load_settings(app.node.try_get_context, app.node.get_all_context().keys())
    stack = CheckpointPipelineStack(app, settings.stack_name, settings=settings)
    cdk.Aspects.of(app).add(AwsSolutionsChecks())
    return Synth(settings=settings, stack=stack, template=assertions.Template.from_stack(stack))


@pytest.fixture(scope="session")
def greenfield(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The default cdk.json: new VPC, new PostgreSQL, reserved concurrency 2."""
    return synthesize({}, tmp_path_factory.mktemp("greenfield"))


@pytest.fixture(scope="session")
def existing(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The common case: the team's VPC and ``ml-postgres``; reserved concurrency 1."""
    return synthesize(EXISTING_CONTEXT, tmp_path_factory.mktemp("existing"))


# The scheduled prune on, on the existing database (the common case), with every policy key.
PRUNE_CONTEXT: dict[str, Any] = {
    **EXISTING_CONTEXT,
    "scheduledPrune": "true",
    "pruneEveryHours": "12",
    "pruneKeepLast": "3",
    "pruneKeepBest": "2",
    "pruneMetric": "loss",
    "pruneMode": "min",
    "pruneKeepEvery": "1000",
    "pruneSuperseded": "true",
}


@pytest.fixture(scope="session")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The existing database with the scheduled prune switched on."""
    return synthesize(PRUNE_CONTEXT, tmp_path_factory.mktemp("pruned"))


@pytest.fixture(scope="session", params=["greenfield", "existing", "pruned"])
def any_synth(request: pytest.FixtureRequest) -> Synth:
    """Each configuration in turn, for properties that must hold in both."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reads a synthesized stack (a fixture returning ``Synth``) is ``slow``.

    A synth starts jsii's node and builds the stack: 15-50 s each on 2 cores, so ``make
    test-fast`` (the inner loop) leaves them out and ``make test`` runs them. Before ``-m``
    deselects (hence ``tryfirst``).
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        fixtures = (d for defs in info.name2fixturedefs.values() for d in defs)
        if any(getattr(d.func, "__annotations__", {}).get("return") == "Synth" for d in fixtures):
            item.add_marker(pytest.mark.slow)
