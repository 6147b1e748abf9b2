"""Every function's role grants exactly what its code and its configuration use, on the right ARNs.

For each ``AWS::Lambda::Function`` in the synthesized template:

* our functions (a ``lambda_writer`` handler): the AWS calls are derived from the source
  (:mod:`tests.infra.aws_calls`), kept where the function's environment sets the variables that
  name their resources, and each must be granted on the resource those variables reference;
  plus what Lambda itself does for the function's configuration — the SQS event source's polling
  and X-Ray segments under active tracing;
* CDK's own custom-resource providers (framework code, not ours): what each provider does for
  the custom resources that point at it;
* every role: AWS's basic execution policy, plus the VPC one exactly when the function is in a VPC.

A call the code makes under one value of a setting only (:data:`BRANCHES`: the IAM token under
``DB_AUTH=iam``, the secret read under ``DB_AUTH=secret``) counts only where the function's
environment sets that value. A secret under a customer KMS key also needs ``kms:Decrypt`` on it.

Anything granted beyond that fails, except the excess listed in :data:`KNOWN_EXCESS` (each one
reported, with why it is still there); an entry no longer needed fails too, so the list shrinks.
A function that is neither ours nor a known provider fails: it must be added here.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.settings import ExistingDatabase
from tests.infra.aws_calls import ROOT, aws_calls
from tests.infra.conftest import EXISTING_CONTEXT, Synth, synthesize

Template = Mapping[str, Any]
EVENT_SOURCE = "<event source>"

# Lambda's SQS poller receives, deletes and reads the queue's attributes with the function's role
# ("Execution role permissions", https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html and
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html list ReceiveMessage,
# DeleteMessage, GetQueueAttributes, as AWS's managed AWSLambdaSQSQueueExecutionRole does); CDK's
# grantConsumeMessages adds ChangeMessageVisibility and GetQueueUrl, which nothing calls.
EVENT_SOURCE_ACTIONS = (
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
)
# Active tracing: Lambda sends the segments with the function's role; neither action supports
# resource-level permissions (https://docs.aws.amazon.com/lambda/latest/dg/services-xray.html).
TRACING_ACTIONS = ("xray:PutTraceSegments", "xray:PutTelemetryRecords")
BASIC_POLICY = "AWSLambdaBasicExecutionRole"  # its own log group's CreateLogStream/PutLogEvents
VPC_POLICY = "AWSLambdaVPCAccessExecutionRole"  # the ENI calls of a function in a VPC

# What CDK's custom-resource providers do for a custom resource of each type: action -> the
# property of the custom resource whose reference is the resource acted on (None: "*").
FRAMEWORK: dict[str, tuple[tuple[str, str | None], ...]] = {
    # The Trigger provider invokes the trigger's handler (HandlerArn: a version of it).
    "Custom::Trigger": (("lambda:InvokeFunction", "HandlerArn"),),
    # @aws-cdk/aws-ec2:restrictDefaultSecurityGroup: strips the default group's rules.
    "Custom::VpcRestrictDefaultSG": tuple(
        (f"ec2:{verb}SecurityGroup{way}", "DefaultSecurityGroupId")
        for verb in ("Authorize", "Revoke")
        for way in ("Ingress", "Egress")
    ),
    # log retention for CDK's provider functions (issue 13 §8), should the stack add it.
    "Custom::LogRetention": (
        ("logs:PutRetentionPolicy", None),
        ("logs:DeleteRetentionPolicy", None),
    ),
}

# Granted, not used; reported in the issue and kept here until infra/ drops them:
# (handler, action, where the resource comes from: env variable or EVENT_SOURCE) -> why.
# Empty since infra/ grants exactly what is used (issue 13 item 2); kept for the next excess.
KNOWN_EXCESS: dict[tuple[str, str, str], str] = {}

# The function (module.name) an AWS call is made in -> (environment variable, the one value under
# which connect() calls it). Checked against lambda_writer/shared/connection.py by
# test_the_db_auth_branches_are_as_listed.
BRANCHES: dict[str, tuple[str, str]] = {
    "lambda_writer.shared.connection._iam_token": ("DB_AUTH", "iam"),
    "lambda_writer.shared.connection._read_secret": ("DB_AUTH", "secret"),
}


@dataclass(frozen=True)
class Need:
    """An action on a resource: the logical ids its ARN references and literals it contains."""

    action: str
    refs: frozenset[str]
    literals: frozenset[str] = frozenset()
    star: bool = False
    why: str = ""

    def matches(self, action: str, resource: Any) -> bool:
        if action != self.action:
            return False
        if self.star:
            return bool(resource == "*")
        text = json.dumps(resource)
        # a literal (a database user) must be a whole ARN segment: "ckpt_writer", not "ckpt_w"
        return (
            resource != "*"
            and references(resource) == self.refs
            and all(
                re.search(rf"(?<![\w.-]){re.escape(lit)}(?![\w.-])", text) for lit in self.literals
            )
        )


def references(expr: Any) -> frozenset[str]:
    """Logical ids an intrinsic expression references (pseudo parameters left out)."""
    found: set[str] = set()
    if isinstance(expr, dict):
        for key, value in expr.items():
            if key == "Ref" and isinstance(value, str) and not value.startswith("AWS::"):
                found.add(value)
            elif key == "Fn::GetAtt":
                found.add(value[0] if isinstance(value, list) else str(value).split(".")[0])
            elif key == "Fn::Sub" and isinstance(value, str | list):
                text = value if isinstance(value, str) else value[0]
                found |= {
                    m.split(".")[0]
                    for m in re.findall(r"\$\{([^}!]+)\}", text)
                    if not m.startswith("AWS::")
                }
            else:
                found |= references(value)
    elif isinstance(expr, list):
        for item in expr:
            found |= references(item)
    return frozenset(found)


def _function_behind(resources: Template, logical_ids: frozenset[str]) -> frozenset[str]:
    """A version or alias stands for its function."""
    out: set[str] = set()
    for lid in logical_ids:
        res = resources.get(lid, {})
        if res.get("Type") in ("AWS::Lambda::Version", "AWS::Lambda::Alias"):
            out |= references(res["Properties"]["FunctionName"])
        else:
            out.add(lid)
    return frozenset(out)


@cache
def _functions_of(module: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, name) of every function in ``module``."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(Path(path).read_text())
    return tuple(
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def enclosing_function(where: str) -> str:
    """``module.function`` of a call site ``module:line`` (the innermost function holding it)."""
    module, line = where.rsplit(":", 1)
    holding = [
        (end - start, name)
        for start, end, name in _functions_of(module)
        if start <= int(line) <= end
    ]
    return f"{module}.{min(holding)[1]}" if holding else module


def _code_needs(
    handler: str, function: Mapping[str, Any], secret_keys: Mapping[str, str]
) -> list[Need]:
    env: Mapping[str, Any] = function.get("Environment", {}).get("Variables", {})
    needs = []
    for call in aws_calls(handler):
        if not call.variables <= env.keys():
            continue  # e.g. the secret read behind DB_AUTH=secret: this function cannot make it
        branch = BRANCHES.get(enclosing_function(call.where))
        if branch is not None and branch[0] in env and env[branch[0]] != branch[1]:
            continue  # e.g. the IAM token of a function that sets DB_AUTH=secret
        values = [env[v] for v in call.variables]
        why = f"{call.where} ({', '.join(sorted(call.variables))})"
        literals = frozenset(v for v in values if isinstance(v, str))
        needs.append(
            Need(
                call.action,
                refs=frozenset().union(*(references(v) for v in values)),
                literals=literals,
                why=why,
            )
        )
        if call.action == "secretsmanager:GetSecretValue":
            # A secret under a customer key is decrypted with the caller's kms:Decrypt
            # (https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html).
            needs += [
                Need("kms:Decrypt", refs=frozenset(), literals=frozenset({key}), why=why)
                for secret, key in secret_keys.items()
                if secret in literals
            ]
    return needs


def _source_spec(source: str, lid: str, template: Template) -> Need:
    """The resource of a KNOWN_EXCESS entry, as a Need with its action left blank."""
    resources = template["Resources"]
    if source == EVENT_SOURCE:
        refs = frozenset().union(
            *(references(m["EventSourceArn"]) for m in _mappings(template, lid))
        )
        return Need("", refs=refs)
    value = resources[lid]["Properties"].get("Environment", {}).get("Variables", {}).get(source)
    return Need("", refs=references(value))


def _mappings(template: Template, lid: str) -> Iterator[Mapping[str, Any]]:
    for res in template["Resources"].values():
        if res["Type"] != "AWS::Lambda::EventSourceMapping":
            continue
        target = references(res["Properties"]["FunctionName"])
        if lid in _function_behind(template["Resources"], target):
            yield res["Properties"]


def needs_of(
    template: Template, lid: str, secret_keys: Mapping[str, str] | None = None
) -> tuple[str, list[Need]]:
    """(what the function is, what it needs) for the function ``lid``; AssertionError if unknown.

    ``secret_keys``: imported secrets' ARNs -> their customer KMS key's ARN.
    """
    resources = template["Resources"]
    props = resources[lid]["Properties"]
    handler = str(props.get("Handler", ""))
    needs: list[Need] = []
    if str(props.get("Runtime", "")).startswith("python") and handler.startswith("lambda_writer."):
        kind = handler
        needs += _code_needs(handler, props, secret_keys or {})
        for mapping in _mappings(template, lid):
            queue = references(mapping["EventSourceArn"])
            assert all(resources[q]["Type"] == "AWS::SQS::Queue" for q in queue), mapping
            needs += [Need(a, refs=queue, why="SQS event source") for a in EVENT_SOURCE_ACTIONS]
    else:
        customs = [
            res
            for res in resources.values()
            if (
                res["Type"].startswith("Custom::")
                or res["Type"] == "AWS::CloudFormation::CustomResource"
            )
            and lid in references(res["Properties"].get("ServiceToken"))
        ]
        assert customs, (
            f"function {lid} (handler {handler!r}, runtime {props.get('Runtime')}) is neither a"
            " lambda_writer handler nor a custom-resource provider: add what it may do to"
            " tests/infra/test_permissions.py"
        )
        kind = " + ".join(sorted({c["Type"] for c in customs})) + " provider"
        for custom in customs:
            assert custom["Type"] in FRAMEWORK, f"{lid}: no expectations for {custom['Type']}"
            for action, prop in FRAMEWORK[custom["Type"]]:
                if prop is None:
                    needs.append(Need(action, refs=frozenset(), star=True, why=custom["Type"]))
                else:
                    target = references(custom["Properties"][prop])
                    needs.append(
                        Need(action, refs=_function_behind(resources, target), why=custom["Type"])
                    )
    if props.get("TracingConfig", {}).get("Mode") == "Active":
        needs += [
            Need(a, refs=frozenset(), star=True, why="active tracing") for a in TRACING_ACTIONS
        ]
    return kind, needs


def role_of(props: Mapping[str, Any]) -> str:
    refs = references(props["Role"])
    assert len(refs) == 1, f"a function's role must be one of the stack's roles: {props['Role']}"
    return next(iter(refs))


def granted(template: Template, role: str) -> list[tuple[str, Any]]:
    """(action, resource) pairs the role's inline and attached stack policies allow."""
    resources = template["Resources"]
    documents = [p["PolicyDocument"] for p in resources[role]["Properties"].get("Policies", [])]
    for res in resources.values():
        attached_to = references(res.get("Properties", {}).get("Roles", []))
        if res["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") and role in attached_to:
            documents.append(res["Properties"]["PolicyDocument"])
    for res in resources.values():
        if res["Type"] == "AWS::IAM::ManagedPolicy":
            attached = references(resources[role]["Properties"].get("ManagedPolicyArns", []))
            if any(resources.get(a) is res for a in attached):
                documents.append(res["Properties"]["PolicyDocument"])
    pairs = []
    for doc in documents:
        for st in doc["Statement"]:
            assert "NotAction" not in st and "NotResource" not in st, st
            if st["Effect"] != "Allow":
                continue
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            targets = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            pairs += [(a, r) for a in actions for r in targets]
    return pairs


def aws_managed_policies(template: Template, role: str) -> set[str]:
    arns = [
        json.dumps(a)
        for a in template["Resources"][role]["Properties"].get("ManagedPolicyArns", [])
    ]
    # AWS's own policies (the stack's are read as documents in granted())
    return {
        a.split(":iam::aws:policy/")[-1].split('"')[0].split("/")[-1]
        for a in arns
        if ":iam::aws:policy/" in a
    }


def problems(
    template: Template, secret_keys: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """(failures, known excess still granted) over every function of ``template``."""
    resources = template["Resources"]
    failures: list[str] = []
    excess_seen: list[str] = []
    functions = {
        lid: r["Properties"] for lid, r in resources.items() if r["Type"] == "AWS::Lambda::Function"
    }
    assert functions, "no AWS::Lambda::Function in the template"
    for lid, props in sorted(functions.items()):
        kind, needs = needs_of(template, lid, secret_keys)
        role = role_of(props)
        pairs = granted(template, role)
        for need in needs:
            if not any(need.matches(a, r) for a, r in pairs):
                failures.append(
                    f"{lid} ({kind}): MISSING {need.action} on {sorted(need.refs) or '*'}"
                    f" for {need.why}"
                )
        allowed = {
            (action, source): _source_spec(source, lid, template)
            for (handler, action, source) in KNOWN_EXCESS
            if handler == kind
        }
        used_allowances: set[tuple[str, str]] = set()
        for action, resource in pairs:
            if any(need.matches(action, resource) for need in needs):
                continue
            known = [
                key
                for key, spec in allowed.items()
                if key[0] == action and Need(action, refs=spec.refs).matches(action, resource)
            ]
            if known:
                used_allowances.update(known)
                excess_seen.append(f"{lid} ({kind}): {action} on {sorted(references(resource))}")
                continue
            failures.append(f"{lid} ({kind}): UNUSED {action} on {json.dumps(resource)}")
        for key in allowed.keys() - used_allowances:
            failures.append(f"{lid} ({kind}): KNOWN_EXCESS {key} is no longer granted: remove it")
        expected_managed = {BASIC_POLICY} | ({VPC_POLICY} if props.get("VpcConfig") else set())
        if aws_managed_policies(template, role) != expected_managed:
            failures.append(
                f"{lid} ({kind}): managed policies {sorted(aws_managed_policies(template, role))},"
                f" expected {sorted(expected_managed)}"
            )
    return failures, excess_seen


def secret_keys_of(synth: Synth) -> dict[str, str]:
    """The imported master secret's ARN -> its customer KMS key's ARN, if it has one."""
    database = synth.settings.database
    if isinstance(database, ExistingDatabase) and database.secret_kms_key_arn:
        return {database.secret_arn: database.secret_kms_key_arn}
    return {}


KMS_KEY = "arn:aws:kms:eu-west-1:123456789012:key/0123abcd-4567-89ef-0123-456789abcdef"


@pytest.fixture(scope="module")
def existing_with_kms(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """``ml-postgres`` whose master secret is under a customer KMS key."""
    return synthesize(
        {**EXISTING_CONTEXT, "dbSecretKmsKeyArn": KMS_KEY}, tmp_path_factory.mktemp("kms")
    )


def test_every_role_grants_exactly_what_its_function_uses(any_synth: Synth) -> None:
    failures, _excess = problems(any_synth.json, secret_keys_of(any_synth))
    assert not failures, "\n".join(failures)


def test_a_master_secret_under_a_customer_key_is_decrypted_by_the_migration_only(
    existing_with_kms: Synth,
) -> None:
    # GIVEN the existing database's secret under a customer key WHEN checked THEN exact
    template = existing_with_kms.json
    failures, _excess = problems(template, secret_keys_of(existing_with_kms))
    assert not failures, "\n".join(failures)
    decrypting = {
        lid
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and any(
            a == "kms:Decrypt" and KMS_KEY in json.dumps(res)
            for a, res in granted(template, role_of(r["Properties"]))
        )
    }
    handlers = {template["Resources"][lid]["Properties"]["Handler"] for lid in decrypting}
    assert handlers == {"lambda_writer.migrate.handler.handler"}
    # AND without the key the analysis reports the decrypt as unused
    failures, _excess = problems(template)
    assert any("UNUSED kms:Decrypt" in f for f in failures), failures


def test_the_migration_needs_what_its_db_auth_uses(greenfield: Synth) -> None:
    # GIVEN the migration's DB_AUTH switched to iam (its grants unchanged)
    template = copy.deepcopy(dict(greenfield.json))
    migration = next(
        lid
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == "lambda_writer.migrate.handler.handler"
    )
    env = template["Resources"][migration]["Properties"]["Environment"]["Variables"]
    assert env["DB_AUTH"] == "secret"
    env["DB_AUTH"] = "iam"
    # WHEN checked THEN the token's grant is missing and the master secret's read is unused
    failures, _excess = problems(template)
    assert any(f.startswith(migration) and "MISSING rds-db:connect" in f for f in failures)
    master = references(env["DB_SECRET_ARN"])
    assert any(
        f.startswith(migration)
        and "UNUSED secretsmanager:GetSecretValue" in f
        and next(iter(master)) in f
        for f in failures
    ), failures


def test_the_db_auth_branches_are_as_listed() -> None:
    # connect() takes the token only under DB_AUTH=iam and reads the secret only otherwise, and
    # nothing else in lambda_writer calls either: BRANCHES says exactly that.
    source = ROOT / "lambda_writer" / "shared" / "connection.py"
    connect = next(
        n
        for n in ast.parse(source.read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "connect"
    )
    branch = next(
        n
        for n in ast.walk(connect)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "settings.db_auth == 'iam'"
    )

    def called(nodes: list[ast.stmt]) -> set[str]:
        return {
            c.func.id
            for n in nodes
            for c in ast.walk(n)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
        }

    assert "_iam_token" in called(branch.body) - called(branch.orelse)
    assert "_read_secret" in called(branch.orelse) - called(branch.body)
    calls = [
        c.func.id
        for path in (ROOT / "lambda_writer").rglob("*.py")
        for c in ast.walk(ast.parse(path.read_text()))
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    ]
    assert calls.count("_iam_token") == calls.count("_read_secret") == 1
    assert {f.rsplit(".", 1)[1] for f in BRANCHES} == {"_iam_token", "_read_secret"}
    assert set(BRANCHES.values()) == {("DB_AUTH", "iam"), ("DB_AUTH", "secret")}
    # and the call sites the analysis finds are in those functions
    sites = {
        (enclosing_function(c.where), c.action)
        for c in aws_calls("lambda_writer.migrate.handler.handler")
    }
    assert ("lambda_writer.shared.connection._iam_token", "rds-db:connect") in sites
    assert (
        "lambda_writer.shared.connection._read_secret",
        "secretsmanager:GetSecretValue",
    ) in sites


def test_every_function_in_the_template_is_checked(any_synth: Synth) -> None:
    # GIVEN the template WHEN each function is classified THEN none is skipped, ours have needs
    resources = any_synth.json["Resources"]
    kinds = {
        lid: needs_of(any_synth.json, lid)
        for lid, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function"
    }
    ours = {kind for kind, needs in kinds.values() if kind.startswith("lambda_writer.")}
    assert {"lambda_writer.writer.handler.handler", "lambda_writer.migrate.handler.handler"} <= ours
    assert all(needs for _kind, needs in kinds.values())


def test_the_analysis_sees_the_writers_calls_and_only_live_ones_count(greenfield: Synth) -> None:
    calls = {(c.action, c.variables) for c in aws_calls("lambda_writer.writer.handler.handler")}
    assert ("sqs:SendMessage", frozenset({"DLQ_URL"})) in calls  # SendMessageBatch to the DLQ
    assert ("rds-db:connect", frozenset({"DB_HOST", "DB_USER"})) in calls  # IAM auth token
    # the secret read behind DB_AUTH=secret is in the code, but the deployed writer uses IAM auth
    assert ("secretsmanager:GetSecretValue", frozenset({"DB_SECRET_ARN"})) in calls
    writer = next(
        lid
        for lid, r in greenfield.json["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == "lambda_writer.writer.handler.handler"
    )
    _kind, needs = needs_of(greenfield.json, writer)
    assert "secretsmanager:GetSecretValue" not in {n.action for n in needs}


def test_a_grant_that_differs_from_the_code_is_caught(greenfield: Synth) -> None:
    # GIVEN the writer's policy without rds-db:connect and with one action nobody calls
    template = copy.deepcopy(dict(greenfield.json))
    policy = next(
        r
        for lid, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Policy" and lid.startswith("WriterFunction")
    )
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    connect = next(s for s in statements if s["Action"] == "rds-db:connect")
    statements.remove(connect)
    statements.append({"Action": "sqs:PurgeQueue", "Effect": "Allow", "Resource": "*"})
    # WHEN checked THEN both are reported
    failures, _excess = problems(template)
    assert any("MISSING rds-db:connect" in f for f in failures), failures
    assert any('UNUSED sqs:PurgeQueue on "*"' in f for f in failures), failures


def test_active_tracing_needs_the_xray_actions_on_star(greenfield: Synth) -> None:
    # GIVEN the writer with active tracing, its X-Ray grant removed
    template = copy.deepcopy(dict(greenfield.json))
    resources = template["Resources"]
    writer = next(
        lid
        for lid, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == "lambda_writer.writer.handler.handler"
    )
    resources[writer]["Properties"]["TracingConfig"] = {"Mode": "Active"}
    policy = next(
        r
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Policy"
        and role_of(resources[writer]["Properties"]) in references(r["Properties"]["Roles"])
    )
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    statements[:] = [s for s in statements if "xray" not in json.dumps(s["Action"])]
    failures, _excess = problems(template)
    assert any(f"{writer} " in f and "MISSING xray:PutTraceSegments" in f for f in failures)
    # WHEN the statement CDK adds for Tracing.ACTIVE is there THEN nothing is missing
    statements.append({"Action": list(TRACING_ACTIONS), "Effect": "Allow", "Resource": "*"})
    assert problems(template)[0] == []
