"""Which of our packages may import which: the directions the layout promises, enforced."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"ckpt_contract", "trainer_client", "lambda_writer", "ckpt_pipeline", "infra", "bench"}


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


@pytest.mark.parametrize(
    "package", ["ckpt_contract", "trainer_client", "lambda_writer", "ckpt_pipeline"]
)
def test_no_runtime_package_imports_infra(package: str) -> None:
    # infra needs aws-cdk-lib; no installed part may require it. Shared numbers live in
    # ckpt_contract.deployment.
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
    for package in ("ckpt_contract", "trainer_client", "lambda_writer", "ckpt_pipeline", "infra"):
        bad = {n for n in imported(package) if n.split(".")[0] in {"tests", "bench"}}
        assert bad == set(), package


def test_the_boundary_check_sees_a_violation(tmp_path: Path) -> None:
    # GIVEN a module that imports the local stand-in WHEN scanned THEN the import is seen.
    module = tmp_path / "m.py"
    module.write_text("from ckpt_pipeline.local.sqs_server import create_pipeline_queues\n")
    assert "ckpt_pipeline.local.sqs_server" in _imports_of(module)
