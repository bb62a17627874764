"""``dist/tandem.zip``: the ``tandem`` package for ``spark-submit --py-files`` (``make dist``); and bytecode in the
zips Spark puts first on its Python processes' path.

``spark-submit`` puts ``--py-files`` and pyspark's own ``python/lib/pyspark.zip`` and ``py4j-*.zip`` ahead of
site-packages on the driver's and every Python worker's path, and Python's zip importer caches no bytecode: each
process compiled every module it imported from them again (0.6 CPU s for pyspark's worker modules, 0.35 s for the
driver's tandem modules). Each zip therefore holds a ``.pyc`` beside each ``.py``, checked against its source's
hash at import, so a stale one is never used (the source is).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKED_HASH = 0b11
"""A ``.pyc`` header's flags: validated by the hash of its source (PEP 552), not by modification times, which a zip
entry keeps only to two seconds."""


def bytecode(source: bytes, shown_as: str) -> bytes | None:
    """The ``.pyc`` of a module's source, checked by its hash at import; ``None`` when this Python cannot compile it
    (it is imported from source then). ``shown_as``: its file name in tracebacks."""
    try:
        code = compile(source, shown_as, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return (importlib.util.MAGIC_NUMBER + CHECKED_HASH.to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(code))


def _with_bytecode(name: str, data: bytes, shown_under: Path) -> Iterator[tuple[str, bytes]]:
    """A zip entry ``name``, then its ``.pyc`` when it is a module this Python compiles (named ``shown_under/name``)."""
    yield name, data
    if name.endswith(".py"):
        compiled = bytecode(data, str(shown_under / name))
        if compiled is not None:
            yield name + "c", compiled


def build_dist(project_root: Path) -> Path:
    """Write ``<project_root>/dist/tandem.zip`` with ``tandem/`` at its top and its modules' bytecode; return it.

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
                    for entry, data in _with_bytecode(str(path.relative_to(PACKAGE.parent)), path.read_bytes(),
                                                      target):
                        archive.writestr(entry, data)
    os.replace(partial, target)
    return target


def has_bytecode(archive: Path, module: str) -> bool:
    """Whether the zip ``archive`` holds ``module`` (a ``.py`` entry's name) compiled by this Python."""
    with zipfile.ZipFile(archive) as opened:
        try:
            return opened.read(module + "c")[:4] == importlib.util.MAGIC_NUMBER
        except KeyError:
            return False


def add_bytecode(archive: Path) -> int:
    """Rewrite the zip ``archive`` with a ``.pyc`` beside each ``.py`` (an existing one replaced); how many.

    A new file renamed over the old one: an installer's cache may hard-link the same file, and it stays as it was.
    """
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    added = 0
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
        names = {info.filename for info in source.infolist()}
        for info in source.infolist():
            if info.filename.endswith(".pyc") and info.filename[:-1] in names:
                continue
            for entry, data in _with_bytecode(info.filename, source.read(info), archive):
                target.writestr(info if entry == info.filename else entry, data)
                added += entry != info.filename
    os.chmod(partial, archive.stat().st_mode & 0o777)
    os.replace(partial, archive)
    return added


def spark_python_zips() -> list[Path]:
    """The zips ``spark-submit`` puts on its Python processes' path: pyspark's ``python/lib/*.zip``."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return []
    return sorted((Path(spec.origin).parent / "python" / "lib").glob("*.zip"))


def compile_spark_zips() -> list[str]:
    """Give pyspark's zips their bytecode where it is missing or from another Python; what was done, a line each."""
    done = []
    for archive in spark_python_zips():
        with zipfile.ZipFile(archive) as opened:
            first = next((n for n in opened.namelist() if n.endswith("/__init__.py")), None)
        if first is not None and not has_bytecode(archive, first):
            done.append(f"{archive.name}: bytecode for {add_bytecode(archive)} modules")
    return done


if __name__ == "__main__":
    if sys.argv[1:] == ["--spark-zips"]:
        print("\n".join(compile_spark_zips()) or "pyspark's zips have their bytecode")
    else:
        built = build_dist(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())
        print(f"built {built} ({len(zipfile.ZipFile(built).namelist())} files)")
