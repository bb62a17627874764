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


class Recorded:
    """A verification that keeps what it was told (rows only on this side as a fourth element, when any)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.proven: int | None = None

    def record(self, output: str, checked: int, differences: list[str], unmatched: list[str] = ()) -> None:
        self.calls.append((output, checked, differences, list(unmatched)) if unmatched else
                          (output, checked, differences))

    def published_through(self, batch_id: int) -> None:
        self.proven = batch_id if self.proven is None else max(self.proven, batch_id)

    def proven_batch(self) -> int | None:
        return self.proven


class ComparingKind(FakeKind):
    """The active's values in ``values``; a row is settled once its id is in ``settled_ids``."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, int] = {}
        self.settled_ids: set[str] = set()

    def settled(self, identities: list[str]) -> list[str]:
        return [i for i in identities if i in self.settled_ids]

    def differences(self, rows: dict[str, dict]) -> list[str]:
        return [f"{i}: {self.values[i]} != {row['value']}" for i, row in sorted(rows.items())
                if self.values[i] != row["value"]]


def test_under_verification_trim_compares_each_row_once_when_it_is_settled_here_too():
    kind, seen = ComparingKind(), Recorded()
    kind.verify_with(seen)
    kind.hold(rows(("a", 1), ("b", 2), ("c", 3)), 1)
    kind.store, kind.values = {"a", "b", "c"}, {"a": 1, "b": 5, "c": 3}
    kind.settled_ids = {"a", "b"}
    kind.trim()
    assert seen.calls == [("fake", 2, ["b: 5 != 2"])]
    assert list(kind.held) == ["c"], "a row not final on this side stays held until it is"
    kind.settled_ids.add("c")
    kind.trim()
    assert seen.calls[-1] == ("fake", 1, []) and kind.held == {}


def test_without_verification_or_on_promotion_nothing_is_compared_and_trim_is_unchanged():
    kind = ComparingKind()
    kind.hold(rows(("a", 1)), 1)
    kind.store, kind.values = {"a"}, {"a": 9}
    kind.trim()
    assert kind.held == {}
    seen = Recorded()
    kind.verify_with(seen)
    kind.hold(rows(("a", 1), ("b", 2)), 2)
    kind.store = {"a"}
    assert kind.flush(batch()) == 1  # a, published by the active, trimmed uncompared; b published
    assert seen.calls == [] and [r["id"] for r in kind.published[-1][1]] == ["b"]


def test_a_comparison_that_fails_never_stops_the_standby():
    class Broken(ComparingKind):
        def differences(self, rows: dict[str, dict]) -> list[str]:
            raise ConnectionError("database gone")

    kind, seen = Broken(), Recorded()
    kind.verify_with(seen)
    kind.hold(rows(("a", 1)), 1)
    kind.store = kind.settled_ids = {"a"}
    kind.trim()
    assert kind.held == {} and seen.calls == []


def test_a_held_row_the_active_never_publishes_though_it_published_rows_held_later_is_reported_once():
    """Issue 60: a version that identifies a row otherwise holds it under an id the active never publishes; once the
    active has published rows held two batches later, it is reported as only in this version (once), still held."""
    kind, seen = FakeKind(), Recorded()
    kind.verify_with(seen)

    def unmatched() -> list[tuple]:
        return [call for call in seen.calls if len(call) == 4]

    kind.hold(rows(("new-id-1", 1), ("same-1", 1)), 1)
    kind.hold(rows(("same-2", 2)), 2)
    kind.store = {"same-1", "same-2"}
    kind.trim()
    assert seen.proven == 2 and unmatched() == [], "the active has published batch 2's rows: not two batches past 1"
    kind.hold(rows(("same-3", 3)), 3)
    kind.store.add("same-3")
    kind.trim()
    assert unmatched() == [("fake", 0, [], ["new-id-1: only in this version (the other version published rows held "
                                            "2 batches later, never this one)"])]
    assert list(kind.held) == ["new-id-1"]
    kind.hold(rows(("same-4", 4)), 4)
    kind.store.add("same-4")
    kind.trim()
    assert len(unmatched()) == 1, "reported once"
    kind.store.add("new-id-1")  # published after all (late): trimmed as any other row
    kind.trim()
    assert kind.held == {} and kind.held_in == {} and kind.reported == set()


def test_a_row_held_before_the_verification_began_counts_from_the_batch_it_began_at():
    kind, seen = FakeKind(), Recorded()
    kind.hold(rows(("old", 1)), 5)
    kind.verify_with(seen)
    assert kind.held_in == {"old": 5}
