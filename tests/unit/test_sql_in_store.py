"""SQL text lives in :mod:`tandem.store` only (pure: parses the sources, imports nothing).

Every string constant of a tandem module outside ``tandem/store/`` (f-string parts too; not
comments, not docstrings nor any other bare string statement, which never reach a database) is
searched for the start of a SQL statement.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "tandem"
STORE = PACKAGE / "store"
NAME = r'(\w+|\{\w*\}|"[^"]+")'  # a table: plain, a psycopg2.sql placeholder or quoted
SQL = re.compile(rf"\b(SELECT|INSERT INTO|UPDATE {NAME} SET|DELETE FROM|CREATE (TEMP |TEMPORARY )?TABLE|"
                 rf"DROP TABLE|ALTER TABLE|TRUNCATE|COPY {NAME}.*FROM STDIN|SAVEPOINT|ROLLBACK TO)\b")
ALLOWED = {
    # the role an instance records when it changes (UPDATE plan_instances ... SET role): left where it is because
    # runtime/roles.py is the HA-critical role machine, not to be touched while the other SQL moved (issue 25)
    "runtime/roles.py": 1,
}
"""Modules outside the store that still hold SQL, with how many string constants of theirs do (and why)."""


def sql_strings(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, text) of each string constant that starts a SQL statement somewhere in it."""
    tree = ast.parse(source, filename)
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare \
                and SQL.search(node.value):
            yield node.lineno, node.value


def test_sql_is_found_in_code_and_not_in_docstrings_or_comments() -> None:
    source = '''"""SELECT in a docstring."""
# DELETE FROM in a comment
def f(cursor, table):
    """INSERT INTO in a docstring."""
    cursor.execute("SELECT 1")
    cursor.execute(f"DELETE FROM {table} WHERE x = %s", (1,))
    x = "no sql, even if it says select"
'''
    assert [line for line, _ in sql_strings(source)] == [5, 6]
    for statement in ("UPDATE plan_instances SET role = %s", "UPDATE {table} SET a = 1", "COPY _batch ({}) FROM STDIN",
                      "CREATE TEMP TABLE _t (a text)", "SAVEPOINT p", "DROP TABLE IF EXISTS _batch"):
        assert list(sql_strings(f"cursor.execute({statement!r})")), statement


def test_sql_text_is_only_in_the_store() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORE in path.parents:
            continue
        hits = [f"{line}: {text.split()[0]} …" for line, text in sql_strings(path.read_text(), str(path))]
        if hits:
            found[path.relative_to(PACKAGE).as_posix()] = hits
    counts = {module: len(hits) for module, hits in found.items()}
    assert counts == ALLOWED, (
        "SQL outside tandem.store (move it into a function of a tandem.store module; or, if a module on ALLOWED "
        "no longer has it, take it off): " + "; ".join(f"{m} line {h}" for m, hits in found.items() for h in hits))
