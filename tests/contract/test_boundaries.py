"""The contract is the only code the trainer client and the writer share."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = {"ckpt_contract", "trainer_client", "lambda_writer", "ckpt_pipeline", "infra"}


def imported_packages(package: str) -> set[str]:
    """Top-level names of our own packages that ``package``'s modules import."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found.update(n.split(".")[0] for n in names if n.split(".")[0] in OUR_PACKAGES)
    return found - {package}


@pytest.mark.parametrize("package", ["trainer_client", "lambda_writer"])
def test_runtime_packages_share_only_the_contract(package: str) -> None:
    # The Lambda bundle ships lambda_writer + ckpt_contract only; the client needs no writer code.
    assert imported_packages(package) == {"ckpt_contract"}


def test_contract_depends_on_nothing_of_ours() -> None:
    assert imported_packages("ckpt_contract") == set()
