"""Bytecode in the zips a Spark job's Python processes import from (``tandem.packaging``): used when it matches its
source, never when it does not, and made again for another Python's.

Imports go through :mod:`zipimport` as Spark's processes do (the zip first on the path), one module name per test.
"""

from __future__ import annotations

import importlib
import importlib.util
import marshal
import sys
import zipfile
from pathlib import Path

from tandem.packaging import add_bytecode, build_dist, bytecode, has_bytecode


def imported(archive: Path, name: str):
    """Module ``name`` imported with ``archive`` first on the path (and nothing of it left behind)."""
    sys.path.insert(0, str(archive))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(archive))
        sys.path_importer_cache.pop(str(archive), None)
        top = name.split(".")[0]
        for loaded in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[loaded]


def zip_of(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def test_a_module_is_imported_from_its_bytecode_and_its_tracebacks_name_its_source(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "lib.zip", {"pkg_a/__init__.py": b"", "pkg_a/mod.py": b"VALUE = 41 + 1\n"})
    assert add_bytecode(archive) == 2
    assert has_bytecode(archive, "pkg_a/mod.py")
    assert zipfile.ZipFile(archive).read("pkg_a/mod.py") == b"VALUE = 41 + 1\n"
    module = imported(archive, "pkg_a.mod")
    assert module.VALUE == 42
    assert module.__file__ == str(archive / "pkg_a" / "mod.pyc")
    assert marshal.loads(zipfile.ZipFile(archive).read("pkg_a/mod.pyc")[16:]).co_filename == str(
        archive / "pkg_a" / "mod.py")


def test_bytecode_that_does_not_match_its_source_is_not_used(tmp_path: Path) -> None:
    stale = bytecode(b"VALUE = 'old'\n", "mod_b.py")
    archive = zip_of(tmp_path / "lib.zip", {"mod_b.py": b"VALUE = 'new'\n", "mod_b.pyc": stale})
    assert imported(archive, "mod_b").VALUE == "new"


def test_another_pythons_bytecode_is_replaced_and_what_this_python_cannot_compile_stays_source(tmp_path: Path) -> None:
    foreign = b"\x00\x00\r\n" + bytecode(b"VALUE = 1\n", "mod_c.py")[4:]
    archive = zip_of(tmp_path / "lib.zip", {"mod_c.py": b"VALUE = 1\n", "mod_c.pyc": foreign,
                                           "future.py": b"def (:\n",
                                           "data.txt": b"kept"})
    assert not has_bytecode(archive, "mod_c.py")
    assert add_bytecode(archive) == 1
    with zipfile.ZipFile(archive) as opened:
        assert sorted(opened.namelist()) == ["data.txt", "future.py", "mod_c.py", "mod_c.pyc"]
        assert opened.read("data.txt") == b"kept"
    assert has_bytecode(archive, "mod_c.py") and imported(archive, "mod_c").VALUE == 1


def test_the_dist_zip_holds_each_module_with_its_bytecode(tmp_path: Path) -> None:
    built = build_dist(tmp_path)
    names = set(zipfile.ZipFile(built).namelist())
    sources = {name for name in names if name.endswith(".py")}
    assert "tandem/runtime/node.py" in sources and "tandem/store/migrations" not in names
    assert {name + "c" for name in sources} <= names
    assert not any("__pycache__" in name for name in names)
    assert any(name.endswith(".sql") for name in names)
