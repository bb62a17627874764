"""``dist/tandem.zip``: the ``tandem`` package for ``spark-submit --py-files`` (``make dist``)."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def build_dist(project_root: Path) -> Path:
    """Write ``<project_root>/dist/tandem.zip`` with ``tandem/`` at its top (no bytecode); return it.

    Written under a temporary name of this process and renamed, so a job starting meanwhile never
    reads half a zip, and two processes building at once (test workers) never write the same file.
    """
    target = project_root / "dist" / "tandem.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".zip.{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for directory, dirs, files in os.walk(PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith((".pyc", ".pyo")):
                    path = Path(directory) / name
                    archive.write(path, path.relative_to(PACKAGE.parent))
    os.replace(partial, target)
    return target


if __name__ == "__main__":
    built = build_dist(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())
    print(f"built {built} ({len(zipfile.ZipFile(built).namelist())} files)")
