"""Build the writer's Lambda bundle (Docker-free) and report its unpacked and zipped size."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from bench._harness import cli, parse
from infra import bundling


def zipped_size(directory: Path, archive: Path) -> int:
    """Bytes of ``directory`` as a deflated zip (what Lambda receives)."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(directory).as_posix())
    return archive.stat().st_size


def main(argv: Sequence[str] | None = None) -> int:
    """Print the bundle size; ``--wheelhouse`` for offline machines."""
    p = cli(__doc__)
    p.add_argument("--wheelhouse", type=Path, default=None)
    args = parse(p, argv)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        bundle.mkdir()
        python = bundling.bytecode_python()
        bundling.build_bundle(bundle, wheelhouse=args.wheelhouse, python=python)
        unpacked = bundling.directory_size(bundle)
        packed = zipped_size(bundle, Path(tmp) / "bundle.zip")
    what = "with bytecode" if python is not None else "sources only: no python3.14 found"
    print(f"writer bundle ({what}): {unpacked / 1e6:.1f} MB unpacked, {packed / 1e6:.1f} MB zipped")
    return 0
