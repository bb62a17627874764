"""What a standby holds of an output, against a fake store: the one hold / trim / flush every output kind uses."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from tandem.outputs.base import BatchInfo, HeldUntilPublished
from tandem.store.registry import InstanceKey

KEY = InstanceKey("plan", "g-1", "node-b")


class FakeKind(HeldUntilPublished[str, dict]):
    """Rows identified by ``id``; ``store`` is what the active has published for good."""

    output = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.store: set[str] = set()
        self.published: list[tuple[int, list[dict]]] = []

    def identities(self, rows: pa.Table) -> dict[str, dict]:
        return {row["id"]: row for row in rows.to_pylist()}

    def published_of(self, held: dict[str, dict]) -> set[str]:
        return self.store & set(held)

    def publish_held(self, held: dict[str, dict], batch: BatchInfo) -> int:
        self.published.append((batch.batch_id, sorted(held.values(), key=lambda r: r["id"])))
        self.store |= set(held)
        return len(held)


def rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "value": v} for i, v in pairs])


def batch(batch_id: int = 99) -> BatchInfo:
    return BatchInfo(KEY, batch_id, epoch=2, published_at=datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_a_newer_row_replaces_the_held_one_and_the_batch_is_the_newest():
    kind = FakeKind()
    kind.hold(rows(("a", 1), ("b", 1)), 4)
    kind.hold(rows(("a", 2)), 5)
    assert kind.held == {"a": {"id": "a", "value": 2}, "b": {"id": "b", "value": 1}} and kind.held_batch == 5


def test_trim_drops_what_the_active_published_for_good():
    kind = FakeKind()
    kind.hold(rows(("a", 1), ("b", 1), ("c", 1)), 1)
    kind.store = {"a", "c", "z"}
    kind.trim()
    assert list(kind.held) == ["b"]


def test_flush_publishes_the_rest_once_as_the_batch_it_was_held_in():
    kind = FakeKind()
    kind.hold(rows(("a", 1), ("b", 1)), 7)
    kind.store = {"a"}
    assert kind.flush(batch(99)) == 1
    assert kind.published == [(7, [{"id": "b", "value": 1}])]
    assert kind.held == {} and kind.flush(batch(100)) == 0 and len(kind.published) == 1


def test_flush_publishes_nothing_when_everything_was_published():
    kind = FakeKind()
    kind.hold(rows(("a", 1)), 3)
    kind.store = {"a"}
    assert kind.flush(batch()) == 0 and kind.published == [] and kind.held == {}


def test_nothing_held_is_nothing_to_flush():
    kind = FakeKind()
    assert kind.flush(batch()) == 0 and kind.published == []
