"""A counter over rows of a table that maintenance trims: Prometheus counters must never go down.

``COUNT``/``SUM`` over ``publish_log`` or ``failover_events`` would fall each time maintenance deletes old rows,
and Prometheus would read that as a reset (``rate`` would then count the whole remainder again). A
:class:`Tally` starts from the table's totals at its first reading and from then on only adds rows it has not
seen, read from a window that goes back further than any transaction stays open (a row's time is when its
transaction began writing it, and it becomes visible at its commit). Keys seen within the window are kept to
count each row once; older ones are forgotten. An exporter's restart starts again from the totals, which
Prometheus handles as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

WINDOW = timedelta(minutes=10)

Labels = tuple[str, ...]
Reading = tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], datetime]


class Tally:
    """Totals per label values, from ``read(since)`` giving ``(totals, rows at or after since, since)``: ``since``
    None is the first reading, with the totals and the rows of a window back from now (and where that window
    began); ``labels`` turns a row into its label values, ``key`` into its identity."""

    def __init__(self, read: Callable[[datetime | None], Reading], labels: Callable[[Mapping[str, Any]], Labels],
                 key: Callable[[Mapping[str, Any]], Hashable], window: timedelta = WINDOW) -> None:
        self.read, self.labels, self.key, self.window = read, labels, key, window
        self.totals: dict[Labels, float] = {}
        self.seen: dict[Hashable, datetime] = {}
        self.floor: datetime | None = None
        """Where the first reading's rows began: every row before it is in the totals, so no later reading
        goes back further (it would count those rows again)."""

    def update(self) -> dict[Labels, float]:
        """Read the rows since the last reading's window and return the totals."""
        if self.floor is None:
            totals, recent, self.floor = self.read(None)
            for row in totals:
                self._add(self.labels(row), float(row["value"]))
            for row in recent:
                self.seen[self.key(row)] = row["at"]
            return dict(self.totals)
        newest = max(self.seen.values(), default=self.floor)
        _, recent, _ = self.read(max(self.floor, newest - self.window))
        self.add_new(recent)
        return dict(self.totals)

    def add_new(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Count the rows not seen yet; forget the keys older than the window before the newest row."""
        for row in rows:
            key = self.key(row)
            if key not in self.seen:
                self.seen[key] = row["at"]
                self._add(self.labels(row), float(row["value"]))
        newest = max(self.seen.values(), default=None)
        if newest is not None:
            self.seen = {k: at for k, at in self.seen.items() if at >= newest - 2 * self.window}

    def _add(self, labels: Labels, value: float) -> None:
        self.totals[labels] = self.totals.get(labels, 0.0) + value
