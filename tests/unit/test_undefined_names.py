"""Every global name a module of the project reads is defined in it, imported or built in (pure: parses the sources).

``python -m compileall`` (``make lint``) does not see a name used without its import; it fails only when that line
runs. A stateless backfill's read-through called ``input_mtimes`` without importing it, which only the temperatures
integration test reached.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("include/tandem", "dags", "plugins", "jobs", "bench", "tests", "scripts") for p in (ROOT / folder).rglob("*.py"))


def module_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (imports, definitions, assignments, ``global`` in functions)."""
    table = symtable.symtable(ast.unparse(tree), "<module>", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}


def global_reads(table: symtable.SymbolTable) -> Iterator[tuple[str, str]]:
    """(scope, name) of every name a nested scope reads from the module's globals."""
    for child in table.get_children():
        for symbol in child.get_symbols():
            if symbol.is_referenced() and symbol.is_global() and not symbol.is_declared_global():
                yield child.get_name(), symbol.get_name()
        yield from global_reads(child)


def undefined(path: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source, str(path))
    known = module_names(tree) | set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__path__"}
    table = symtable.symtable(source, str(path), "exec")
    top = {s.get_name() for s in table.get_symbols() if s.is_referenced() and not s.is_assigned()
           and not s.is_imported() and not s.is_namespace()}
    found = [f"module level: {name}" for name in sorted(top - known)]
    found += [f"{scope}: {name}" for scope, name in sorted(set(global_reads(table))) if name not in known]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_global_name_is_defined(path: Path) -> None:
    assert undefined(path) == [], f"{path.relative_to(ROOT)} reads names it never defines or imports"


def test_the_check_finds_a_missing_import(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("from os import path\n\n\ndef f(x):\n    return input_mtimes(path.join(x, 'a'))\n")
    assert undefined(module) == ["f: input_mtimes"]
