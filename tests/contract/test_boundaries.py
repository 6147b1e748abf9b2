"""Which of our packages may import which: the directions the layout promises, enforced."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (
    "ckpt_contract",
    "ckpt_stack",
    "trainer_client",
    "lambda_writer",
    "ckpt_pipeline",
    "infra",
)
TOP_LEVEL = {*SHIPPED, "bench"}


def _imports_of(path: Path) -> set[str]:
    """Dotted names of everything ``path`` imports (absolute imports only; we use no others)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported(package_dir: str) -> set[str]:
    """Our own modules (dotted) that any module under ``package_dir`` imports."""
    found: set[str] = set()
    for path in (ROOT / package_dir).rglob("*.py"):
        found.update(n for n in _imports_of(path) if n.split(".")[0] in TOP_LEVEL)
    return found


def top_levels(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("package", ["trainer_client", "lambda_writer"])
def test_runtime_packages_share_only_the_contract(package: str) -> None:
    # The Lambda bundle ships lambda_writer + ckpt_contract only; the client needs no writer code.
    assert top_levels(imported(package)) - {package} == {"ckpt_contract"}


def test_contract_depends_on_nothing_of_ours() -> None:
    assert top_levels(imported("ckpt_contract")) - {"ckpt_contract"} == set()


def test_the_contract_holds_the_wire_contracts_only() -> None:
    # The report message, the stored objects' pins, the pack of reports, the DLQ envelope, the
    # restart record and the messages' kinds (told without parsing). The
    # stack's context rules are ckpt_stack's, the deployment numbers
    # lambda_writer.shared.constants', retention lambda_writer.prune's.
    modules = {p.stem for p in (ROOT / "ckpt_contract").glob("*.py")}
    assert modules == {
        "__init__", "exceptions", "message", "objects", "pack", "dlq", "restart", "kinds"
    }  # fmt: skip


# --- The rooms ---------------------------------------------------------------------------------
# The client, one room per job; beside them its core (settings, errors, logging, the collector
# pause) and its public face (__init__.py, torch_integration.py):
# * report/   a report validated, spooled and sent; the reporter, its launch, its lifecycle
#             (SIGTERM, Spot notice, close). It owns a finisher: it may import finish/.
# * finish/   a save made durable, hashed and post-processed off the loop; it reports through the
#             callback the reporter gives it, so it never imports report/.
# * storage/  where a checkpoint's bytes live and whether they are still as written; it imports
#             of finish/ only the post-step interface its S3 upload step implements.
# * restart/  the read side: the lookup, the walk, the decision and its collectives, what a node
#             fetches, the restore's orchestration, the restart's record. It reports as the
#             reporter's launch, so it may import report/ (and storage/); no room imports it.
# * integrations/  the framework adapters only: they call into the rooms, and no room imports them.
# Each room may import the core, itself and the rooms listed for it; nothing else of the client.
CLIENT_CORE = (
    "trainer_client.config",
    "trainer_client.exceptions",
    "trainer_client._log",
    "trainer_client._gc",
)
CLIENT_ROOMS: dict[str, tuple[str, ...]] = {
    "report": ("trainer_client.report", "trainer_client.finish", "trainer_client.storage"),
    "finish": ("trainer_client.finish", "trainer_client.storage"),
    "storage": ("trainer_client.storage", "trainer_client.finish.post_step"),
    "restart": (
        "trainer_client.restart",
        "trainer_client.report",
        "trainer_client.finish",
        "trainer_client.storage",
    ),
}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("room", sorted(CLIENT_ROOMS))
def test_each_client_room_imports_only_what_it_may(room: str) -> None:
    allowed = CLIENT_ROOMS[room] + CLIENT_CORE
    bad = {
        n
        for n in imported(f"trainer_client/{room}")
        if n.startswith("trainer_client.") and not _within(n, allowed)
    }
    assert bad == set(), room


def test_the_clients_core_imports_no_room() -> None:
    bad: dict[str, set[str]] = {}
    for dotted in CLIENT_CORE:
        path = ROOT / (dotted.replace(".", "/") + ".py")
        found = {
            n
            for n in _imports_of(path)
            if n.startswith("trainer_client.") and not _within(n, CLIENT_CORE)
        }
        if found:
            bad[dotted] = found
    assert bad == {}


def test_the_client_has_its_rooms_and_a_small_top_level() -> None:
    # What lies loose beside the rooms: the public face and the core, nothing of one job.
    loose = {p.stem for p in (ROOT / "trainer_client").glob("*.py")}
    core = {d.rsplit(".", 1)[1] for d in CLIENT_CORE}
    assert loose == {"__init__", "torch_integration", *core}
    rooms = {p.parent.name for p in (ROOT / "trainer_client").glob("*/__init__.py")}
    assert rooms == {*CLIENT_ROOMS, "integrations"}


# integrations/ holds the framework adapters and nothing else.
ADAPTERS = (
    "huggingface", "lightning", "dcp", "sharded", "_lightning_layout", "_lightning_saves",
    "_loss_watch", "_upload", "_paths",
)  # fmt: skip


def test_integrations_holds_the_framework_adapters_only() -> None:
    assert {p.stem for p in (ROOT / "trainer_client" / "integrations").glob("*.py")} == {
        "__init__", *ADAPTERS
    }  # fmt: skip


def test_the_room_check_sees_a_room_importing_an_adapter(tmp_path: Path) -> None:
    # GIVEN a finisher module importing the reporter and an adapter WHEN scanned THEN both are
    # outside what finish/ may import.
    module = tmp_path / "m.py"
    module.write_text(
        "from trainer_client.report.reporter import CheckpointReporter\n"
        "from trainer_client.integrations.huggingface import CheckpointReporterCallback\n"
    )
    allowed = CLIENT_ROOMS["finish"] + CLIENT_CORE
    outside = {n for n in _imports_of(module) if not _within(n, allowed)}
    assert "trainer_client.report.reporter" in outside
    assert "trainer_client.integrations.huggingface" in outside


# lambda_writer: one folder per function, each importing only the shared core, its own modules
# and the contract: a function's cold start never pays for another's code.
FUNCTIONS = ("writer", "breaker", "migrate", "prune")


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_imports_only_the_shared_core_and_the_contract(function: str) -> None:
    allowed = ("lambda_writer.shared", f"lambda_writer.{function}", "ckpt_contract")
    bad = {
        n
        for n in imported(f"lambda_writer/{function}")
        if n != "lambda_writer" and not any(n == a or n.startswith(a + ".") for a in allowed)
    }
    assert bad == set(), function


def test_the_shared_core_imports_no_function() -> None:
    bad = {
        n
        for n in imported("lambda_writer/shared")
        if n != "lambda_writer" and not n.startswith(("lambda_writer.shared", "ckpt_contract"))
    }
    assert bad == set()


def test_the_function_folders_are_the_packages_only_modules() -> None:
    # Nothing of the bundle's code lies beside the folders but the public face.
    loose = {p.name for p in (ROOT / "lambda_writer").glob("*.py")}
    assert loose == {"__init__.py"}
    assert {p.parent.name for p in (ROOT / "lambda_writer").glob("*/handler.py")} == set(FUNCTIONS)


def _defined(package: str) -> dict[str, set[str]]:
    """{class or function name: the modules (relative paths) that define it at top level}."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                found.setdefault(node.name, set()).add(str(path.relative_to(ROOT)))
    return found


# Retention in one home: its policy, plan, executor, reads and errors are defined in
# lambda_writer/prune only; the CLI's prune and the scheduled prune's handler call them.
RETENTION_NAMES = {
    "RetentionPolicy", "plan_job", "JobPlan", "Removal", "plan_jobs",
    "apply_job_plans", "job_checkpoints", "CheckpointRow", "PruneError", "PolicyError",
    "PreservationPolicy", "LatestN", "BestN", "EveryNSteps", "AnyOf", "AllOf",
}  # fmt: skip


def test_retention_is_defined_in_one_package() -> None:
    elsewhere: dict[str, set[str]] = {}
    for package in (*SHIPPED, "bench"):
        for name, modules in _defined(package).items():
            outside = {m for m in modules if not m.startswith("lambda_writer/prune/")}
            if name in RETENTION_NAMES and outside:
                elsewhere[name] = outside
    assert elsewhere == {}


def private_imports(path: Path) -> set[str]:
    """``module.name`` for each private name (``_x``) ``path`` imports from one of our modules."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] in TOP_LEVEL
        ):
            found |= {f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")}
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    # A name two modules share is an API between them: public, with a docstring that says so.
    offenders: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            if found := private_imports(path):
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_private_import_check_sees_one(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from trainer_client.report._build import build_report, _CONFIGURED_FIELDS\n")
    assert private_imports(module) == {"trainer_client.report._build._CONFIGURED_FIELDS"}


def module_level_names(path: Path) -> set[str]:
    """The public functions and constants ``path`` defines at top level (a re-export,
    ``NAME = module.NAME``, defines nothing)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Name):
                    continue
                value = node.value
                if isinstance(value, ast.Attribute) and value.attr == target.id:
                    continue
                names.add(target.id)
    return {n for n in names if not n.startswith("_")}


# Names every module of a kind defines by convention, one meaning each: a command module's
# add_parser/run (ckpt_pipeline.cli's COMMANDS), a Lambda function's handler and its Powertools
# logger/metrics, a script's main, a TypeVar T.
CONVENTIONS = {"add_parser", "run", "handler", "logger", "metrics", "main", "T"}


def test_one_function_or_constant_per_name_across_the_shipped_packages() -> None:
    # As for classes: one name, one idea. A function or constant two modules need is defined in
    # one and imported by the other; two ideas get two names.
    defined: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            for name in module_level_names(path):
                defined.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    twice = {n for n, m in defined.items() if len(m) > 1} - CONVENTIONS
    assert twice == set(), {n: defined[n] for n in twice}


def test_the_homonym_check_sees_functions_and_constants(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import x\nA = 1\nB: int = 2\nC = x.C\n_D = 3\ndef f(): ...\nasync def g(): ...\n"
    )
    assert module_level_names(module) == {"A", "B", "f", "g"}


def test_one_class_per_name_across_the_shipped_packages() -> None:
    # Two classes with one name in two rooms read as one idea; give the second its own name.
    # The errors that each package defines under its own root (``SettingsError`` of the functions
    # and of the CDK app, ``ConfigError``...) are the exception: the same shape, said per package.
    classes: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and not node.name.endswith("Error"):
                    classes.setdefault(node.name, set()).add(str(path.relative_to(ROOT)))
    assert {n: m for n, m in classes.items() if len(m) > 1} == {}


@pytest.mark.parametrize(
    "package", ["ckpt_contract", "ckpt_stack", "trainer_client", "lambda_writer", "ckpt_pipeline"]
)
def test_no_runtime_package_imports_infra(package: str) -> None:
    # infra needs aws-cdk-lib; no installed part may require it. Shared numbers live in
    # lambda_writer.shared.constants.
    assert "infra" not in top_levels(imported(package))


def test_production_operator_tools_never_import_the_local_stand_in_or_the_demo() -> None:
    bad = {
        n
        for n in imported("ckpt_pipeline/ops")
        if n.startswith(("ckpt_pipeline.local", "ckpt_pipeline.demo", "bench"))
    }
    assert bad == set()


def test_the_local_stand_in_never_imports_the_demo() -> None:
    bad = {n for n in imported("ckpt_pipeline/local") if n.startswith("ckpt_pipeline.demo")}
    assert bad == set()


def test_shipped_code_never_imports_tests_or_benches() -> None:
    for package in SHIPPED:
        bad = {n for n in imported(package) if n.split(".")[0] in {"tests", "bench"}}
        assert bad == set(), package


def test_the_boundary_check_sees_a_violation(tmp_path: Path) -> None:
    # GIVEN a module that imports the local stand-in WHEN scanned THEN the import is seen.
    module = tmp_path / "m.py"
    module.write_text("from ckpt_pipeline.local.sqs_server import create_pipeline_queues\n")
    assert "ckpt_pipeline.local.sqs_server" in _imports_of(module)


# Packages whose imports of the writer go through its public face (lambda_writer/__init__.py).
# tests/ test the writer's parts, so they may reach into them; the benches measure the writer as
# it runs, one execution environment from make_handler.
WRITER_CLIENTS = (
    "ckpt_contract",
    "ckpt_stack",
    "trainer_client",
    "ckpt_pipeline",
    "infra",
    "bench",
)
# The deployment numbers (plain values, no import cost) are read by the CDK app and the local
# stand-in as a module of their own.
PUBLIC_MODULES = {"lambda_writer.shared", "lambda_writer.shared.constants"}


def _writer_public_names() -> set[str]:
    import lambda_writer

    return set(lambda_writer.__all__)


@pytest.mark.parametrize("package", WRITER_CLIENTS)
def test_other_packages_import_only_the_writers_public_names(package: str) -> None:
    public = {f"lambda_writer.{name}" for name in _writer_public_names()} | PUBLIC_MODULES
    bad = {
        n
        for n in imported(package)
        if n.startswith("lambda_writer.")
        and n not in public
        and not n.startswith("lambda_writer.shared.constants.")
    }
    assert bad == set(), f"{package} imports lambda_writer's submodules: import from lambda_writer"


def test_the_writers_public_names_all_resolve() -> None:
    import lambda_writer

    for name in lambda_writer.__all__:
        assert getattr(lambda_writer, name) is not None, name


def test_the_public_face_check_sees_a_submodule_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from lambda_writer.writer.handler import make_handler\nimport lambda_writer.writer.dlq\n"
    )
    names = _imports_of(module)
    public = {f"lambda_writer.{name}" for name in _writer_public_names()}
    assert {"lambda_writer.writer.handler", "lambda_writer.writer.dlq"} <= names - public


def environment_reads(path: Path) -> int:
    """How many times ``path`` reads the process's environment (``os.environ``, ``getenv``)."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if _is_environ(node) if isinstance(node, ast.expr) else False:
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            count += name == "getenv"
    return count


# The client reads its environment in its configuration module only (resolved once, validated,
# errors naming the variable). The restart's CKPT_RESUME_DATABASE_URL is read where it is used
# until the restart has its room (its rewrite is under way).
CLIENT_CONFIG_MODULES = {"trainer_client/config.py"}
CLIENT_ENV_PENDING: set[str] = set()


def test_the_client_reads_the_environment_in_its_config_only() -> None:
    readers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "trainer_client").rglob("*.py")
        if environment_reads(path)
    }
    assert readers - CLIENT_CONFIG_MODULES == CLIENT_ENV_PENDING


def test_the_environment_read_check_sees_each_way(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\nfrom os import environ\n"
        "a = os.environ.get('A')\nb = environ['B']\nc = os.getenv('C')\n"
    )
    assert environment_reads(module) == 3


# --- The writer is built from explicit settings, never configured through os.environ --------
# Only the Lambda entry point reads its environment (WriterSettings.from_env). Tests of the
# other functions' entry points (the migrator's, the breaker's, the pruner's), whose input is
# their function's environment, are the exception.
ENTRY_POINT_TESTS = {
    "tests/lambda_writer/test_migrate_handler.py",
    "tests/lambda_writer/test_channel_binding.py",
    "tests/lambda_writer/test_breaker.py",
    "tests/lambda_writer/test_prune_handler.py",
}


def writer_variables() -> set[str]:
    """The variables ``WriterSettings.from_env`` reads, from its source (``get("NAME")``), less
    the AWS SDK's own (``AWS_REGION``...: every boto3 client of the process reads them, and the
    local stand-in points them at its emulator as Lambda's runtime points them at AWS)."""
    source = (ROOT / "lambda_writer" / "shared" / "settings.py").read_text()
    names = set(re.findall(r'\bget\("([A-Z][A-Z0-9_]*)"\)', source))
    assert {"DATABASE_URL", "DLQ_URL", "DB_HOST"} <= names  # the pattern still finds them
    return {n for n in names if not n.startswith("AWS_")}


def _is_environ(node: ast.expr) -> bool:
    # os.environ, or a bare environ (from os import environ)
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _keys(node: ast.expr) -> set[str]:
    """The literal string keys of a dict display (``{"A": ...}`` or ``dict(A=...)``)."""
    if isinstance(node, ast.Dict):
        return {
            k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg for k in node.keywords if k.arg}
    return set()


def environment_writes(path: Path) -> set[str]:
    """Names of the variables ``path`` sets in its own process's environment (literal names):
    ``monkeypatch.setenv``, ``os.environ[...] =``, ``os.environ.update/setdefault``, and the
    local stand-in's ``environ_set``."""
    written: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id
            first = node.args[0] if node.args else None
            on_environ = isinstance(func, ast.Attribute) and _is_environ(func.value)
            if name in ("setenv", "putenv") or (on_environ and name == "setdefault"):
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    written.add(first.value)
            elif (on_environ and name == "update") or name == "environ_set":
                for arg in node.args:
                    written |= _keys(arg)
                written |= {k.arg for k in node.keywords if k.arg}
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Subscript)
                    and _is_environ(target.value)
                    and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str)
                ):
                    written.add(target.slice.value)
    return written


def test_no_test_bench_or_cli_path_configures_the_writer_through_the_environment() -> None:
    watched = writer_variables()
    offenders: dict[str, set[str]] = {}
    for top in ("tests", "bench", "ckpt_pipeline", "trainer_client", "infra"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative in ENTRY_POINT_TESTS:
                continue
            hits = {
                n for n in environment_writes(path) if n in watched or n.startswith("POWERTOOLS_")
            }
            if hits:
                offenders[relative] = hits
    assert offenders == {}, (
        "pass settings explicitly: lambda_writer.make_handler(WriterSettings(...)) for the writer,"
        " ckpt_pipeline.cli.main(argv, env) for a command"
    )


def test_the_environment_check_sees_each_way_of_setting_a_variable(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n"
        "def f(monkeypatch, environ_set):\n"
        "    monkeypatch.setenv('DATABASE_URL', 'x')\n"
        "    os.environ['DLQ_URL'] = 'y'\n"
        "    os.environ.update({'DB_HOST': 'h'}, DB_PORT='1')\n"
        "    os.environ.setdefault('POWERTOOLS_LOG_LEVEL', 'ERROR')\n"
        "    environ_set({'DB_NAME': 'n'})\n"
        "    env = {**os.environ, 'DB_USER': 'child process: not ours'}\n"
    )
    assert environment_writes(module) == {
        "DATABASE_URL", "DLQ_URL", "DB_HOST", "DB_PORT", "POWERTOOLS_LOG_LEVEL", "DB_NAME"
    }  # fmt: skip


# --- Wire and configuration contracts written once --------------------------------------------
RUNTIME_PACKAGES = (
    "ckpt_contract",
    "ckpt_stack",
    "trainer_client",
    "lambda_writer",
    "ckpt_pipeline",
)


@pytest.mark.parametrize("package", RUNTIME_PACKAGES)
def test_no_runtime_package_imports_the_cdk(package: str) -> None:
    # The CDK context's rules live in ckpt_stack.context so that preflight reads them
    # without aws-cdk-lib installed.
    names: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        names |= {n.split(".")[0] for n in _imports_of(path)}
    assert names & {"aws_cdk", "cdk_nag", "constructs"} == set()


def _context_keys() -> set[str]:
    """The keys ``ckpt_stack.context`` reads: the literal first argument of each
    ``ctx.<read>("key", ...)`` call."""
    tree = ast.parse((ROOT / "ckpt_stack" / "context.py").read_text())
    keys: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "ctx"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
    assert {"writerReservedConcurrency", "vpcId", "createDatabase"} <= keys
    return keys


CONTEXT_KEYS_MODULE = ROOT / "ckpt_stack" / "context_keys.py"
# Preflight's findings name the key an operator would change (vpcId, dbEndpoint, …); it reads no
# context value itself (it gets PipelineSettings), so it may name keys, all of them known ones.
NAMES_KEYS = ROOT / "ckpt_pipeline" / "ops" / "preflight_resources.py"


def test_the_known_keys_are_exactly_the_keys_read() -> None:
    # The list that refuses unknown keys (ckpt_stack.context_keys) and the reads cannot drift:
    # a key read but not listed would be refused, a key listed but not read would pass unused.
    from ckpt_stack.context_keys import KNOWN_KEYS

    assert sorted(KNOWN_KEYS) == sorted(_context_keys())
    assert len(set(KNOWN_KEYS)) == len(KNOWN_KEYS)


def test_the_cdk_context_keys_are_read_in_one_module() -> None:
    # infra/ and preflight take PipelineSettings from ckpt_stack.context: no other
    # shipped module names a context key (a second reading would drift from the first). The
    # one-word keys (prefix, wheelhouse) are ordinary words elsewhere; the camelCase ones are not.
    keys = {k for k in _context_keys() if not k.islower()}
    elsewhere: dict[str, set[str]] = {}
    for package in (*RUNTIME_PACKAGES, "infra"):
        for path in (ROOT / package).rglob("*.py"):
            if path in (ROOT / "ckpt_stack" / "context.py", CONTEXT_KEYS_MODULE, NAMES_KEYS):
                continue
            literals = {
                node.value
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            }
            if found := literals & keys:
                elsewhere[str(path.relative_to(ROOT))] = found
    assert elsewhere == {}


def test_the_dlq_envelope_is_named_in_the_contract_only() -> None:
    from ckpt_contract import dlq

    names = set(dlq.WRITER_ATTRIBUTES)
    assert {"ErrorClass", "OriginalMessageId"} <= names
    elsewhere: dict[str, set[str]] = {}
    for package in ("lambda_writer", "ckpt_pipeline"):
        for path in (ROOT / package).rglob("*.py"):
            literals = {
                node.value
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            }
            if found := literals & names:
                elsewhere[str(path.relative_to(ROOT))] = found
    assert elsewhere == {}


def test_the_benches_plotting_helpers_import_no_bench() -> None:
    # Each bench draws its figure with bench._plot's helpers; the helpers never import a bench
    # back (not even for a type), so the benches' imports have no circle.
    path = ROOT / "bench" / "_plot.py"
    assert {n for n in _imports_of(path) if n.split(".")[0] == "bench"} == set()
