"""Bundle layout and pip options, without network (the real build runs in test_cli_synth)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import stat
import subprocess
import sys
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
    # A bundle built once an interpreter for its bytecode exists is a different asset.
    assert bundling.asset_fingerprint(root, bytecode=True) != bundling.asset_fingerprint(root)


HOST_VERSION = "{}.{}".format(*sys.version_info[:2])


def test_bytecode_python_must_run_the_runtime_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN CKPT_BUNDLE_PYTHON names this host's interpreter
    monkeypatch.setenv(bundling.BYTECODE_PYTHON_ENV, shlex.join([sys.executable, "-I"]))
    # THEN it is taken for its own version, and refused for another one, naming the setting
    assert bundling.bytecode_python(HOST_VERSION) == [sys.executable, "-I"]
    refused = rf"{bundling.BYTECODE_PYTHON_ENV}.*must run CPython 2.7"
    with pytest.raises(BundlingError, match=refused):
        bundling.bytecode_python("2.7")
    # AND without the setting, a python<version> that is not on PATH means no bytecode step
    monkeypatch.delenv(bundling.BYTECODE_PYTHON_ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bundling.bytecode_python("3.99") is None


def test_compiled_bundle_imports_without_compiling_from_a_read_only_copy(tmp_path: Path) -> None:
    # GIVEN a bundle with a module, byte-compiled by this host's CPython (standing in for 3.14)
    bundle = tmp_path / "task"
    (bundle / "pkg").mkdir(parents=True)
    (bundle / "pkg" / "__init__.py").write_text("")
    (bundle / "pkg" / "mod.py").write_text("VALUE = 42\n")
    bundling.compile_bytecode(bundle, [sys.executable])
    cached = Path(importlib.util.cache_from_source(str(bundle / "pkg" / "mod.py")))
    header = cached.read_bytes()[:16]
    # THEN the pyc is this version's, hash-based and unchecked (valid whatever the mtimes after
    # unzipping: PEP 552 flags word = 0b01)
    assert header[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(header[4:8], "little") == 0b01
    # WHEN imported from a read-only tree whose sources are newer than their bytecode
    for path in bundle.rglob("*.py"):
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 3600))
    for path in [*bundle.rglob("*"), bundle]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    probe = (
        "import importlib._bootstrap_external as b, sys\n"
        "seen = []\n"
        "orig = b.SourceLoader.source_to_code\n"
        "def record(self, data, path, *args, **kwargs):\n"
        "    seen.append(path)\n"
        "    return orig(self, data, path, *args, **kwargs)\n"
        "b.SourceLoader.source_to_code = record\n"
        f"sys.path.insert(0, {str(bundle)!r})\n"
        "import pkg.mod\n"
        "print(seen, pkg.mod.VALUE)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()
    finally:
        for path in [bundle, *bundle.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    # THEN the module came from its bytecode: nothing was compiled
    assert out == "[] 42"


def test_compile_failure_is_a_bundling_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def (:\n")
    with pytest.raises(BundlingError, match="byte-compiling the bundle failed"):
        bundling.compile_bytecode(tmp_path, [sys.executable])


@pytest.mark.slow
def test_local_bundler_reports_failure_instead_of_raising(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An empty wheelhouse: pip resolves nothing offline, CDK must get False (Docker fallback).
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundler = bundling.LocalBundler(wheelhouse=wheels)
    assert bundler.try_bundle(str(tmp_path / "out"), None) is False
    assert "wheelhouse" in capsys.readouterr().err
