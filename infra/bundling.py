"""Docker-free packaging of the writer bundle: pip installs Lambda (arm64) wheels, then the sources.

The bundle is ``lambda_writer/`` (handler, SQL, migrations, CA roots) and ``ckpt_contract/`` plus
the wheels of ``lambda_writer/requirements.txt`` built for the Lambda runtime's CPython and
architecture. Synth never imports the handler; it only packages files.

Offline machines: download the wheels once (``python -m infra.bundling download-wheelhouse
wheelhouse``) and synth with ``-c wheelhouse=wheelhouse`` (pip then runs ``--no-index``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

from infra import constants
from infra.exceptions import BundlingError

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lambda_writer", "ckpt_contract")
REQUIREMENTS = Path("lambda_writer") / "requirements.txt"
# Wheels whose dependencies the Lambda runtime already has (botocore): installed with --no-deps.
REQUIREMENTS_NO_DEPS = Path("lambda_writer") / "requirements-nodeps.txt"
CA_BUNDLE = Path("lambda_writer") / "certs" / "amazon-trust-services.pem"
# Bumped when the bundle layout changes, so the asset hash changes with it.
BUNDLER_REVISION = "3"
# A command that runs CPython of the Lambda runtime's version (default: python3.14 on PATH), for
# the bytecode step below. Any architecture will do: bytecode depends on the version only.
BYTECODE_PYTHON_ENV = "CKPT_BUNDLE_PYTHON"
# Where Lambda unpacks the bundle: the .pyc files record their sources under it rather than under
# the build directory, so the bytecode is the same wherever it is built.
TASK_ROOT = "/var/task"
# The bytecode step, run in the bundle's directory (locally and in the Docker fallback).
COMPILEALL_ARGS = ("-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                   "-d", TASK_ROOT, ".")  # fmt: skip
_IGNORED_DIRS = frozenset({"__pycache__", "tests", ".mypy_cache", ".pytest_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")
_IGNORED_FILES = frozenset({REQUIREMENTS.name, REQUIREMENTS_NO_DEPS.name})

# psycopg-binary >= 3.3 ships aarch64 wheels tagged manylinux_2_28 only, pydantic-core ships
# manylinux2014 (= manylinux_2_17) only, and pip does not widen a manylinux_2_28 --platform to older
# tags. So both are named; the exact pins in requirements.txt keep pip from settling on the older
# psycopg-binary 3.2 that manylinux2014 alone resolves to (checked after install below). The
# python3.12+ runtimes run on Amazon Linux 2023 (glibc 2.34), which both tags need at most
# (https://docs.aws.amazon.com/lambda/latest/dg/lambda-runtimes.html).
PLATFORM_TAGS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64")


def pip_target_args(python_version: str = constants.LAMBDA_PYTHON_VERSION) -> list[str]:
    """pip options that select wheels for the Lambda runtime instead of the build host."""
    args: list[str] = []
    for tag in PLATFORM_TAGS:
        args += ["--platform", tag]
    return [
        *args,
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        "--only-binary=:all:",
    ]


def _source_files(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            relative = path.relative_to(root)
            if any(part in _IGNORED_DIRS for part in relative.parts):
                continue
            if (
                path.is_file()
                and not path.name.endswith(_IGNORED_SUFFIXES)
                and path.name not in _IGNORED_FILES
            ):
                yield path


def bytecode_python(python_version: str = constants.LAMBDA_PYTHON_VERSION) -> list[str] | None:
    """The command of a CPython ``python_version`` to byte-compile the bundle with, or None.

    ``CKPT_BUNDLE_PYTHON`` (a command line) wins over ``python<version>`` on PATH; one that runs
    another version is an error, since its bytecode would be ignored by the runtime.
    """
    configured = os.environ.get(BYTECODE_PYTHON_ENV, "").strip()
    if configured:
        command = shlex.split(configured)
    else:
        found = shutil.which(f"python{python_version}")
        if found is None:
            return None
        command = [found]
    probe = subprocess.run(
        [*command, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    version = probe.stdout.strip()
    if probe.returncode != 0 or version != python_version:
        raise BundlingError(
            f"{BYTECODE_PYTHON_ENV}/PATH: {shlex.join(command)} must run CPython {python_version}"
            f" (the Lambda runtime's), got {version or probe.stderr.strip()[-300:]!r}"
        )
    return command


def compile_bytecode(output_dir: Path, python: Sequence[str]) -> None:
    """Byte-compile every module of the bundle with ``python`` (the runtime's CPython version).

    Lambda runs the bundle from a read-only /var/task (only /tmp is writable,
    https://docs.aws.amazon.com/whitepapers/latest/security-overview-aws-lambda/lambda-isolation-technologies.html),
    so Python cannot cache what it compiles there: a bundle without ``__pycache__`` compiles every
    module it imports on every cold start (BENCHMARKS.md §5: 2.3-2.5x the handler's import).
    ``unchecked-hash`` pycs are used whatever the files' mtimes after unzipping (PEP 552).
    """
    result = subprocess.run(
        [*python, *COMPILEALL_ARGS],
        cwd=output_dir, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise BundlingError(
            f"byte-compiling the bundle failed:\n{(result.stdout + result.stderr).strip()[-3000:]}"
        )


def asset_fingerprint(
    root: Path = REPO_ROOT,
    python_version: str = constants.LAMBDA_PYTHON_VERSION,
    *,
    bytecode: bool = False,
) -> str:
    """A hash of everything that decides the bundle's content (sources, pins, target platform).

    ``bytecode``: whether the bundle is byte-compiled, so that a bundle built without an
    interpreter of the runtime's version is rebuilt once one is there.
    """
    digest = hashlib.sha256()
    digest.update(f"rev={BUNDLER_REVISION};{pip_target_args(python_version)}".encode())
    digest.update(f";bytecode={bytecode}".encode())
    digest.update((root / REQUIREMENTS).read_bytes())
    digest.update((root / REQUIREMENTS_NO_DEPS).read_bytes())
    for path in _source_files(root):
        digest.update(str(path.relative_to(root).as_posix()).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def copy_sources(root: Path, output_dir: Path) -> None:
    """Copy the two packages into ``output_dir`` without caches, tests or the requirements file."""
    if not (root / CA_BUNDLE).is_file():
        raise BundlingError(
            f"missing {CA_BUNDLE}: the writer verifies the proxy's TLS certificate with it"
        )
    for path in _source_files(root):
        target = output_dir / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def install_wheels(
    output_dir: Path,
    *,
    root: Path = REPO_ROOT,
    wheelhouse: Path | None = None,
    python_version: str = constants.LAMBDA_PYTHON_VERSION,
    target: Sequence[str] | None = None,
) -> None:
    """pip-install the runtime wheels for the Lambda platform into ``output_dir``.

    ``target``: other pip platform options (default: the Lambda runtime's, ``pip_target_args``);
    ``["--only-binary=:all:"]`` lays the bundle out for this host (bench.cold_start).
    """
    platform = pip_target_args(python_version) if target is None else list(target)
    base = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--target", str(output_dir), *platform,
    ]  # fmt: skip
    if wheelhouse is not None:
        base += ["--no-index", "--find-links", str(wheelhouse)]
    for command in (
        [*base, "--requirement", str(root / REQUIREMENTS)],
        [*base, "--no-deps", "--requirement", str(root / REQUIREMENTS_NO_DEPS)],
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BundlingError(
                f"pip install for the Lambda platform failed:\n{result.stderr.strip()}"
            )
    _check_psycopg_binary(output_dir)


def _check_psycopg_binary(output_dir: Path) -> None:
    """Fail loudly if pip picked a psycopg-binary that does not match psycopg (the 3.2 trap)."""
    versions = {
        dist.name.split("-")[0]: dist.name.split("-")[1].removesuffix(".dist-info")
        for dist in output_dir.glob("*.dist-info")
    }
    psycopg, binary = versions.get("psycopg"), versions.get("psycopg_binary")
    if psycopg is None or binary != psycopg:
        raise BundlingError(
            f"bundle has psycopg {psycopg} with psycopg-binary {binary}; expected equal versions"
        )


def build_bundle(
    output_dir: Path,
    *,
    root: Path = REPO_ROOT,
    wheelhouse: Path | None = None,
    python: Sequence[str] | None = None,
    target: Sequence[str] | None = None,
) -> None:
    """Build the complete writer bundle into ``output_dir`` (wheels, our sources, bytecode).

    ``python``: the runtime-version CPython to byte-compile with; None ships sources only (and
    says what that costs). ``target``: as for :func:`install_wheels`.
    """
    install_wheels(output_dir, root=root, wheelhouse=wheelhouse, target=target)
    shutil.rmtree(output_dir / "bin", ignore_errors=True)  # console scripts of the wheels
    copy_sources(root, output_dir)
    if python is None:
        print(
            f"ckpt-pipeline: no python{constants.LAMBDA_PYTHON_VERSION} to byte-compile the writer"
            " bundle with: every cold start will compile its modules (~0.3 s more here). Put"
            f" python{constants.LAMBDA_PYTHON_VERSION} on PATH or set {BYTECODE_PYTHON_ENV}.",
            file=sys.stderr,
        )
        return
    compile_bytecode(output_dir, python)


def directory_size(path: Path) -> int:
    """Total bytes of the regular files under ``path``."""
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


@jsii.implements(cdk.ILocalBundling)
class LocalBundler:
    """``ILocalBundling`` that builds the bundle with the host's pip; False lets CDK try Docker."""

    def __init__(
        self,
        *,
        root: Path = REPO_ROOT,
        wheelhouse: Path | None = None,
        python: Sequence[str] | None = None,
    ) -> None:
        self._root = root
        self._wheelhouse = wheelhouse
        self._python = python

    # jsii passes the arguments positionally; the extra keywords guard against future additions.
    def try_bundle(self, output_dir: str, options: Any = None, **_kw: Any) -> bool:
        """Build into ``output_dir``; on failure explain on stderr and return False (-> Docker)."""
        try:
            build_bundle(
                Path(output_dir), root=self._root, wheelhouse=self._wheelhouse, python=self._python
            )
        except (BundlingError, OSError) as exc:
            print(
                f"ckpt-pipeline: local bundling failed ({exc}); falling back to Docker. "
                "Offline? Run `python -m infra.bundling download-wheelhouse wheelhouse` where "
                "PyPI is "
                "reachable and synth with -c wheelhouse=wheelhouse.",
                file=sys.stderr,
            )
            return False
        return True


def _docker_command(python_version: str) -> list[str]:
    """The fallback inside the SAM build image: same pip options, same layout."""
    pip = " ".join(
        [
            "pip install --quiet --no-compile --target /asset-output",
            *pip_target_args(python_version),
        ]
    )
    script = (
        f"{pip} --requirement /asset-input/{REQUIREMENTS.as_posix()}"
        f" && {pip} --no-deps --requirement /asset-input/{REQUIREMENTS_NO_DEPS.as_posix()}"
        " && rm -rf /asset-output/bin && "
        + " && ".join(f"cp -r /asset-input/{package} /asset-output/" for package in PACKAGES)
        + " && find /asset-output -name __pycache__ -prune -exec rm -rf {} + "
        + " && rm -f /asset-output/lambda_writer/requirements*.txt"
        # The build image's python is the runtime's: the same bytecode step as compile_bytecode.
        + f" && cd /asset-output && python {shlex.join(COMPILEALL_ARGS)}"
    )
    return ["bash", "-c", script]


def writer_code(
    runtime: lambda_.Runtime, *, wheelhouse: Path | None = None, root: Path = REPO_ROOT
) -> lambda_.Code:
    """One asset for the writer and the migration function (same files, two handlers)."""
    python = bytecode_python()
    return lambda_.Code.from_asset(
        str(root),
        # A custom hash over just the packaged inputs: CDK then neither fingerprints nor copies the
        # whole repository (.venv, node_modules) and the hash is stable across machines.
        asset_hash=asset_fingerprint(root, bytecode=python is not None),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        bundling=cdk.BundlingOptions(
            image=runtime.bundling_image,
            local=LocalBundler(root=root, wheelhouse=wheelhouse, python=python),
            command=_docker_command(constants.LAMBDA_PYTHON_VERSION),
        ),
    )


def _download_wheelhouse(target: Path) -> int:
    base = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--dest", str(target), *pip_target_args(),
    ]  # fmt: skip
    for command in (
        [*base, "--requirement", str(REPO_ROOT / REQUIREMENTS)],
        [*base, "--no-deps", "--requirement", str(REPO_ROOT / REQUIREMENTS_NO_DEPS)],
    ):
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            return code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``download-wheelhouse DIR`` | ``build DIR``: prepare offline wheels, or build the bundle."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=("download-wheelhouse", "build"))
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--wheelhouse", type=Path, default=None, help="for build: offline wheel directory"
    )
    args = parser.parse_args(argv)
    if args.action == "download-wheelhouse":
        return _download_wheelhouse(args.directory)
    args.directory.mkdir(parents=True, exist_ok=True)
    build_bundle(args.directory, wheelhouse=args.wheelhouse, python=bytecode_python())
    print(f"{args.directory}: {directory_size(args.directory) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
