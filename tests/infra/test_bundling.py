"""Bundle layout and pip options, without network (the real build runs in test_cli_synth)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra import bundling
from infra.exceptions import BundlingError
from tests.infra.conftest import REPO_ROOT


def test_pip_targets_the_lambda_runtime() -> None:
    args = bundling.pip_target_args("3.14")
    assert args[args.index("--python-version") + 1] == "3.14"
    assert "--only-binary=:all:" in args and args[4:6] == ["--implementation", "cp"]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_28_aarch64"  # psycopg-binary >= 3.3 lives only here
    assert all(p.endswith("_aarch64") for p in platforms)


def test_requirements_pin_psycopg_exactly() -> None:
    # The manylinux2014 tag would otherwise let pip settle on psycopg-binary 3.2.
    lines = (REPO_ROOT / bundling.REQUIREMENTS).read_text().splitlines()
    assert any(line.startswith("psycopg[binary]==3.3") for line in lines)


def test_sources_exclude_caches_tests_and_requirements(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for package in bundling.PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    (root / "lambda_writer" / "__pycache__").mkdir()
    (root / "lambda_writer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (root / "lambda_writer" / "tests").mkdir()
    (root / "lambda_writer" / "tests" / "test_x.py").write_text("")
    out = tmp_path / "out"
    bundling.copy_sources(root, out)
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert "lambda_writer/certs/amazon-trust-services.pem" in files
    assert any(f.startswith("lambda_writer/migrations/") and f.endswith(".sql") for f in files)
    assert "ckpt_contract/__init__.py" in files
    assert not any(
        "__pycache__" in f or "/tests/" in f or f.endswith("requirements.txt") for f in files
    )


def test_missing_ca_bundle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "lambda_writer").mkdir()
    with pytest.raises(BundlingError, match=r"amazon-trust-services\.pem"):
        bundling.copy_sources(tmp_path, tmp_path / "out")


def test_fingerprint_tracks_sources_and_not_caches(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for package in bundling.PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    before = bundling.asset_fingerprint(root)
    (root / "lambda_writer" / "__pycache__").mkdir()
    (root / "lambda_writer" / "__pycache__" / "y.pyc").write_bytes(b"x")
    assert bundling.asset_fingerprint(root) == before
    (root / "lambda_writer" / "migrations" / "9999_new.sql").write_text("SELECT 1;")
    assert bundling.asset_fingerprint(root) != before
    assert bundling.asset_fingerprint(root, python_version="3.13") != bundling.asset_fingerprint(
        root
    )


def test_local_bundler_reports_failure_instead_of_raising(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty wheelhouse: pip resolves nothing offline, CDK must get False (Docker fallback).
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundler = bundling.LocalBundler(wheelhouse=wheels)
    assert bundler.try_bundle(str(tmp_path / "out"), None) is False
    assert "wheelhouse" in capsys.readouterr().err
