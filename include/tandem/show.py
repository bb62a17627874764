"""A plan's outputs printed to a terminal, merged over its instances (``tandem query``, the demo)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from tandem.errors import NothingPublished
from tandem.reading import read_output


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def render_rows(rows: list[Mapping[str, Any]], title: str) -> Table:
    """Rows of any output as a table: one column per field, in the order the rows give them."""
    columns: list[str] = []
    for row in rows:
        columns += [name for name in row if name not in columns]
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column in ("bucket_start", "event_time"), overflow="fold")
    for row in rows:
        table.add_row(*[_shown(row.get(column, "")) for column in columns])
    if not rows:
        table.caption = "no rows"
    return table


def render_line(row: Mapping[str, Any]) -> str:
    """One row as ``field=value, …`` (a followed output's new rows)."""
    return ", ".join(f"{name}={_shown(value)}" for name, value in row.items())


def show_output(console: Console, cluster, plan, output: str, *, limit: int | None = None) -> None:
    """Print an output's first ``limit`` rows (all time; an aggregation by minute), from PostgreSQL."""
    kept = plan.outputs[output].granularities
    try:  # outputs without buckets ignore the granularity
        rows = read_output(cluster, plan, "minute" if not kept or "minute" in kept else None, output=output)
    except NothingPublished:
        rows = []
    shown = rows[:limit] if limit is not None else rows
    console.print(render_rows(shown, f"{plan.name} {output} ({plan.outputs[output].kind}, PostgreSQL; "
                                     f"{len(shown)} of {len(rows)} rows)"))
