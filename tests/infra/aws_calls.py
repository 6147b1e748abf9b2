"""The AWS calls a Lambda function's code makes, read from its source with ``ast``.

Starting at the function's handler module, every ``lambda_writer`` module it imports (also inside
functions: the writer defers its boto3 imports) is parsed. A client is any ``client("service", …)``
call with a literal service name (``boto3.client`` and ``lambda_writer.shared.aws.client`` alike).
The analysis follows the client to where its methods are called — a local name, ``self.<attr>``
(also when the client is handed to a constructor or a function), or a direct ``client(…).method`` —
and maps each method to its operation by botocore's service model.

For each call it also traces the arguments that name the resource (``QueueUrl``, ``SecretId``,
``UUID``, …) back to the environment variables they come from: through settings fields (each
settings class's ``from_env`` says which variable fills which field), local assignments,
``self.<attr>`` set in ``__init__``, and parameters (to every call of the function or class).
A call whose resource variables the deployed function does not set cannot happen there (e.g. the
Secrets Manager read behind ``DB_AUTH=secret`` when only ``DB_HOST`` is given).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import botocore.session
from botocore import xform_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "lambda_writer"

# Operation input members that name the resource a call acts on. The others (Port, Entries,
# Enabled, …) do not decide which ARN the grant must name.
RESOURCE_MEMBERS = frozenset(
    {
        "QueueUrl",
        "SecretId",
        "UUID",
        "FunctionName",
        "TopicArn",
        "KeyId",
        "DBHostname",
        "DBUsername",
        "Name",
        "Bucket",
        "TableName",
    }
)

# Client methods that are not API operations but still need a permission: the IAM auth token is
# signed locally, and the database (here the proxy) checks ``rds-db:connect`` for it
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/UsingWithRDS.IAMDBAuth.IAMPolicy.html).
CUSTOM_METHODS = {
    ("rds", "generate_db_auth_token"): ("rds-db:connect", ("DBHostname", "DBUsername"))
}
# Methods that make no request.
NO_REQUEST = frozenset({"close", "can_paginate", "get_waiter"})
# Where the IAM prefix differs from the service's signing name.
IAM_PREFIX = {"monitoring": "cloudwatch"}
# Batch operations are authorized by their single-message action
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-api-permissions-reference.html).
BATCH_ACTION = {
    "sqs:SendMessageBatch": "sqs:SendMessage",
    "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
}


class AnalysisError(AssertionError):
    """The source holds an AWS call the analysis cannot map; says where."""


@dataclass(frozen=True)
class AwsCall:
    """One call site: the IAM action it needs and the env variables naming its resource."""

    where: str  # module:line
    action: str
    # member -> the environment variables the argument comes from
    resources: tuple[tuple[str, frozenset[str]], ...]

    @property
    def variables(self) -> frozenset[str]:
        return frozenset(v for _, names in self.resources for v in names)


@dataclass
class _Module:
    name: str
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node

    def enclosing(self, node: ast.AST, kind: type[ast.AST] | tuple[type[ast.AST], ...]) -> Any:
        current: ast.AST | None = self.parents.get(node)
        while current is not None and not isinstance(current, kind):
            current = self.parents.get(current)
        return current


def _path_of(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


@cache
def _parse(module: str) -> _Module:
    path = _path_of(module)
    return _Module(module, ast.parse(path.read_text(), filename=str(path)))


def module_closure(module: str) -> list[_Module]:
    """``module`` and every ``lambda_writer`` module it imports, transitively."""
    seen: dict[str, _Module] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or not _path_of(name).is_file():
            continue
        seen[name] = parsed = _parse(name)
        for node in _runtime_nodes(parsed.tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            todo.extend(n for n in names if n.split(".")[0] == PACKAGE)
    return list(seen.values())


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``: imports there never run, and
    ``lambda_writer/__init__.py`` names its whole surface that way while loading each name on
    first use (so the writer's closure does not hold the breaker's calls)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _name(node.test) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


class _Analysis:
    def __init__(self, modules: list[_Module]) -> None:
        self.modules = modules
        self.field_env = self._field_env()

    # --- where settings fields come from ---------------------------------------------------

    def _field_env(self) -> dict[str, frozenset[str]]:
        found: dict[str, set[str]] = {}
        for mod in self.modules:
            for cls in (n for n in ast.walk(mod.tree) if isinstance(n, ast.ClassDef)):
                for fn in cls.body:
                    if not (isinstance(fn, ast.FunctionDef) and fn.name == "from_env"):
                        continue
                    for call in ast.walk(fn):
                        if isinstance(call, ast.Call) and _name(call.func) == "cls":
                            for kw in call.keywords:
                                if kw.arg:
                                    found.setdefault(kw.arg, set()).update(
                                        self._env_reads(kw.value, fn, set())
                                    )
        return {k: frozenset(v) for k, v in found.items()}

    def _env_reads(self, expr: ast.AST, fn: ast.FunctionDef, seen: set[str]) -> set[str]:
        """Env variables a from_env expression reads (``get("X")``, ``env.get("X", …)``)."""
        out: set[str] = set()
        if isinstance(expr, ast.Call):
            if _name(expr.func) == "get" and expr.args and _literal(expr.args[0]):
                out.add(_literal(expr.args[0]) or "")
            receiver = [expr.func.value] if isinstance(expr.func, ast.Attribute) else []
            for arg in [*receiver, *expr.args, *(k.value for k in expr.keywords)]:
                out |= self._env_reads(arg, fn, seen)
        elif isinstance(expr, ast.Name) and expr.id not in seen:
            seen.add(expr.id)
            for value in _assigned(fn, expr.id):
                out |= self._env_reads(value, fn, seen)
        elif isinstance(expr, ast.BoolOp | ast.IfExp):
            for child in ast.iter_child_nodes(expr):
                out |= self._env_reads(child, fn, seen)
        return out

    # --- clients and their method calls ----------------------------------------------------

    def calls(self) -> Iterator[AwsCall]:
        for mod in self.modules:
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.Call) and _name(node.func) == "client":
                    service = _literal(node.args[0]) if node.args else None
                    if service is not None:
                        for method_call in self._method_calls(mod, node):
                            yield self._aws_call(mod, service, method_call)

    def _method_calls(self, mod: _Module, creation: ast.Call) -> Iterator[ast.Call]:
        parent = mod.parents[creation]
        if isinstance(parent, ast.keyword):  # Foo(sqs=client("sqs"))
            parent = mod.parents[parent]
        fn = mod.enclosing(creation, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(parent, ast.Attribute):  # client(...).method(...)
            call = mod.parents[parent]
            assert isinstance(call, ast.Call), f"{mod.name}:{creation.lineno}"
            yield call
        elif isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Name):
            yield from _calls_on(fn, parent.targets[0].id)
        elif isinstance(parent, ast.Assign) and _self_attr(parent.targets[0]):
            cls = mod.enclosing(creation, ast.ClassDef)
            yield from _calls_on_self(cls, _self_attr(parent.targets[0]) or "")
        elif isinstance(parent, ast.Call):  # handed to a class or function
            yield from self._calls_in_callee(parent, creation)
        else:
            raise AnalysisError(
                f"{mod.name}:{creation.lineno}: a client used in a way the analysis does not"
                " follow (assign it to a name or self.<attr>, or pass it to a constructor)"
            )

    def _calls_in_callee(self, call: ast.Call, arg: ast.AST) -> Iterator[ast.Call]:
        for _mod, target, offset in self._definitions(_name(call.func) or ""):
            fn = _init_of(target) if isinstance(target, ast.ClassDef) else target
            if fn is None:
                continue
            param = _param_for(fn, call, arg, offset)
            if param is None:
                continue
            if isinstance(target, ast.ClassDef):
                for attr in _self_attrs_from(fn, param):
                    yield from _calls_on_self(target, attr)
            else:
                yield from _calls_on(fn, param)

    def _definitions(self, name: str) -> Iterator[tuple[_Module, Any, int]]:
        for mod in self.modules:
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef) and node.name == name:
                    yield mod, node, 1
                elif isinstance(node, ast.FunctionDef) and node.name == name:
                    is_method = isinstance(mod.parents.get(node), ast.ClassDef)
                    yield mod, node, 1 if is_method else 0

    def _aws_call(self, mod: _Module, service: str, call: ast.Call) -> AwsCall:
        assert isinstance(call.func, ast.Attribute)
        method = call.func.attr
        where = f"{mod.name}:{call.lineno}"
        if method == "get_paginator":
            method = xform_name(_literal(call.args[0]) or "")
        members: tuple[str, ...]
        if (service, method) in CUSTOM_METHODS:
            action, members = CUSTOM_METHODS[(service, method)]
        elif method in NO_REQUEST:
            action, members = "", ()
        else:
            model = _service_model(service)
            operations = {xform_name(op): op for op in model.operation_names}
            if method not in operations:
                raise AnalysisError(
                    f"{where}: {service}.{method} is no operation of botocore's model"
                )
            operation = operations[method]
            prefix = IAM_PREFIX.get(model.signing_name, model.signing_name)
            action = BATCH_ACTION.get(f"{prefix}:{operation}", f"{prefix}:{operation}")
            shape = model.operation_model(operation).input_shape
            members = tuple(m for m in (shape.members if shape else {}) if m in RESOURCE_MEMBERS)
        fn = mod.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
        resources = []
        for kw in call.keywords:
            if kw.arg in members:
                variables = frozenset(self._trace(mod, fn, kw.value, depth=0))
                if not variables:
                    raise AnalysisError(
                        f"{where}: cannot tell which environment variable names {kw.arg}"
                    )
                resources.append((kw.arg, variables))
        return AwsCall(where, action, tuple(sorted(resources)))

    # --- where a resource argument comes from ----------------------------------------------

    def _trace(self, mod: _Module, fn: Any, expr: ast.AST, *, depth: int) -> set[str]:
        if depth > 8:
            return set()
        out: set[str] = set()
        if isinstance(expr, ast.Attribute):
            if expr.attr in self.field_env:
                return set(self.field_env[expr.attr])
            if _name(expr.value) == "self":
                cls = mod.enclosing(expr, ast.ClassDef)
                for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                    for value in _assigned_self(method, expr.attr):
                        out |= self._trace(mod, method, value, depth=depth + 1)
        elif isinstance(expr, ast.Name) and fn is not None:
            for value in _assigned(fn, expr.id):
                out |= self._trace(mod, fn, value, depth=depth + 1)
            if expr.id in _params(fn):
                out |= self._trace_param(mod, fn, expr.id, depth=depth + 1)
        elif isinstance(expr, ast.BoolOp | ast.IfExp | ast.Call):
            for child in ast.iter_child_nodes(expr):
                out |= self._trace(mod, fn, child, depth=depth + 1)
        return out

    def _trace_param(
        self, mod: _Module, fn: ast.FunctionDef, param: str, *, depth: int
    ) -> set[str]:
        cls = mod.parents.get(fn)
        name = cls.name if fn.name == "__init__" and isinstance(cls, ast.ClassDef) else fn.name
        params = _params(fn)
        index = params.index(param)
        out: set[str] = set()
        for caller in self.modules:
            for call in ast.walk(caller.tree):
                if not (isinstance(call, ast.Call) and _name(call.func) == name):
                    continue
                offset = 1 if params and params[0] in ("self", "cls") else 0
                values = [k.value for k in call.keywords if k.arg == param]
                if index - offset < len(call.args) and index >= offset:
                    values.append(call.args[index - offset])
                caller_fn = caller.enclosing(call, (ast.FunctionDef, ast.AsyncFunctionDef))
                for value in values:
                    out |= self._trace(caller, caller_fn, value, depth=depth)
        return out


def aws_calls(handler: str) -> list[AwsCall]:
    """Every AWS call the code behind ``handler`` ("package.module.function") can make."""
    module = handler.rsplit(".", 1)[0]
    if not _path_of(module).is_file():
        raise AnalysisError(f"handler {handler!r}: no module {module} in the repository")
    return [c for c in _Analysis(module_closure(module)).calls() if c.action]


@cache
def _service_model(service: str) -> Any:
    return botocore.session.get_session().get_service_model(service)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and _name(node.value) == "self":
        return node.attr
    return None


def _params(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def _assigned(fn: ast.AST, name: str) -> Iterator[ast.AST]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            yield node.value
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
            # a, b = x, y  (element by element; the whole value when it is not a tuple)
            names = [_name(e) for e in node.targets[0].elts]
            if name in names:
                value = node.value
                if isinstance(value, ast.Tuple) and len(value.elts) == len(names):
                    yield value.elts[names.index(name)]
                else:
                    yield value
        elif (
            isinstance(node, ast.AnnAssign | ast.NamedExpr)
            and _name(node.target) == name
            and node.value is not None
        ):
            yield node.value


def _assigned_self(fn: ast.AST, attr: str) -> Iterator[ast.AST]:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(_self_attr(t) == attr for t in targets) and node.value is not None:
            yield node.value


def _calls_on(fn: ast.AST | None, name: str) -> Iterator[ast.Call]:
    for node in ast.walk(fn) if fn is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _name(node.func.value) == name
            and isinstance(node.func.value, ast.Name)
        ):
            yield node


def _calls_on_self(cls: ast.ClassDef | None, attr: str) -> Iterator[ast.Call]:
    for node in ast.walk(cls) if cls is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _self_attr(node.func.value) == attr
        ):
            yield node


def _init_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )


def _param_for(fn: ast.FunctionDef, call: ast.Call, arg: ast.AST, offset: int) -> str | None:
    params = _params(fn)
    for kw in call.keywords:
        if kw.value is arg:
            return kw.arg
    for i, value in enumerate(call.args):
        if value is arg and i + offset < len(params):
            return params[i + offset]
    return None


def _self_attrs_from(init: ast.FunctionDef, param: str) -> Iterator[str]:
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and _name(node.value) == param:
            for target in node.targets:
                attr = _self_attr(target)
                if attr:
                    yield attr
