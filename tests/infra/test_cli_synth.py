"""The real CDK CLI synthesizes offline from the repository root, with real local bundling."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from infra import bundling, constants
from tests.infra.conftest import REPO_ROOT

# Measured at about 26 MB unpacked / 11 MB zipped; Lambda allows 250 MB unpacked
# (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
MAX_BUNDLE_BYTES = 40_000_000


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cdk_synth_offline_bundles_the_writer(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CDK_DISABLE_VERSION_CHECK": "true",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        ["npx", "cdk", "synth", "--no-notices", "-q", "-o", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=230, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert "Template validation found issues" not in result.stderr
    # npx runs the CLI and the app's jsii on package.json's Node, a supported one: no banner.
    assert "end-of-life" not in result.stderr

    template = json.loads((out / "ckpt-checkpoint-pipeline.template.json").read_text())
    types = [resource["Type"] for resource in template["Resources"].values()]
    assert types.count("AWS::SQS::Queue") == 2
    assert "AWS::RDS::DBProxy" in types and "Custom::Trigger" in types
    assert json.loads((out / "validation-report.json").read_text()).get("pluginReports") == []
    nag_report = (out / "AwsSolutions--ckpt-checkpoint-pipeline-NagReport.csv").read_text()
    assert '"Non-Compliant"' not in nag_report

    writer = next(
        r for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == constants.WRITER_HANDLER
    )  # fmt: skip
    # CDK derives the asset hash from our custom fingerprint, never from the repository tree.
    bundle = out / writer["Metadata"]["aws:asset:path"]
    assert bundle.is_dir()
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert "lambda_writer/certs/amazon-trust-services.pem" in files
    assert "lambda_writer/migrations/0001_checkpoints.sql" in files
    assert "ckpt_contract/message.py" in files
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    # psycopg-binary 3.3.x for CPython 3.14 on aarch64 (not the 3.2 a manylinux2014-only pip finds).
    assert any(f.startswith("psycopg_binary-3.3.") for f in files)
    tag = constants.LAMBDA_PYTHON_VERSION.replace(".", "")
    assert any(
        f.startswith("psycopg_binary/") and f"cpython-{tag}-aarch64-linux-gnu.so" in f
        for f in files
    )
    assert any(
        f.startswith("pydantic_core/") and f"cpython-{tag}-aarch64-linux-gnu.so" in f for f in files
    )
    # The X-Ray SDK for Powertools' Tracer, without the botocore the runtime provides.
    assert any(f.startswith("aws_xray_sdk/") for f in files)
    assert any(f.startswith("wrapt/") for f in files)
    assert not any(f.startswith(("boto3/", "botocore/")) for f in files)

    unpacked = bundling.directory_size(bundle)
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(bundle.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(bundle).as_posix())
    print(
        f"writer bundle: {unpacked / 1e6:.1f} MB unpacked, "
        f"{archive.stat().st_size / 1e6:.1f} MB zipped"
    )
    assert unpacked < MAX_BUNDLE_BYTES
