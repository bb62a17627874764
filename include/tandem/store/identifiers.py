"""SQL that names tables and columns taken from configuration: every such name is quoted.

A plan's table, key, measure and value names come from its YAML file: they are data, and they
reach SQL only through :mod:`psycopg2.sql` (``sql.Identifier`` for a table or column name,
``sql.Literal`` for a name used as a JSON key, ``sql.Placeholder`` for a parameter) and the two
helpers here, never through string formatting. Names fixed in Tandem's own code
(``output_events``, ``plan``, ``instance`` …) may stay plain SQL text.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg2 import sql


def identifiers(names: Iterable[str], qualifier: str | None = None) -> sql.Composed:
    """``"a", "b"`` (with ``qualifier``: ``"q"."a", "q"."b"``): the names quoted and joined by commas."""
    return sql.SQL(", ").join(sql.Identifier(*([qualifier] if qualifier else []), name) for name in names)


def each(template: str, names: Iterable[str]) -> sql.Composed:
    """``template`` once per name, with the quoted name in place of ``{0}``, concatenated.

    E.g. ``each(" AND c.{0} = p.{0}", ["symbol"])`` is `` AND c."symbol" = p."symbol"``; no names give
    an empty text.
    """
    return sql.Composed([sql.SQL(template).format(sql.Identifier(name)) for name in names])
