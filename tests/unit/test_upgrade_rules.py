"""The pure rules of an upgrade (issue 48 §2): which standby runs the new version first, when its verification
passes, and how two versions' rows are compared."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

from tandem.names import ACTIVE, BACKUP, PASSIVE
from tandem.outputs.base import row_difference, same_value
from tandem.store.upgrades import OutputCheck
from tandem.supervisor.decisions import HOT, InstanceView, LeaseView
from tandem.supervisor.health import BLOCKED, DEAD, HEALTHY, InstanceHealth
from tandem.supervisor.upgrade import DIFFER, PASS, WAIT, behind_by, shadow_of, twice_published, verdict


def inst(node: str, state: str = HEALTHY, role: str | None = PASSIVE) -> InstanceHealth:
    return InstanceHealth(node, state, f"{node} is {state.lower()}", role, 0, None)


def view(*instances: InstanceHealth, drained: tuple[str, ...] = ()) -> InstanceView:
    return InstanceView("trades", "shard-1", tuple(i.node for i in instances), HOT, 3.0,
                        {i.node: i for i in instances}, LeaseView("a", 1, True), frozenset(drained), {})


def test_the_shadow_is_a_live_passive_before_a_backup_never_a_drained_or_blocked_node():
    assert shadow_of(view(inst("a", role=ACTIVE), inst("b", role=BACKUP), inst("c")), "a") == "c"
    assert shadow_of(view(inst("a", role=ACTIVE), inst("b", role=BACKUP)), "a") == "b"
    assert shadow_of(view(inst("a", role=ACTIVE), inst("b"), inst("c")), "a") == "b"
    assert shadow_of(view(inst("a", role=ACTIVE), inst("b", DEAD), inst("c", BLOCKED)), "a") is None
    assert shadow_of(view(inst("a", role=ACTIVE), inst("b"), drained=("b",)), "a") is None


def check(output: str, checked: int, differing: int = 0) -> OutputCheck:
    return OutputCheck(output, checked, differing, [f"row {i}" for i in range(differing)])


def test_verification_waits_for_its_time_rows_and_catch_up_and_stops_at_the_first_difference():
    def outcome(checks, elapsed, verify_s=30, min_rows=1, behind_s=0.5):
        return verdict(checks, elapsed, verify_s=verify_s, min_rows=min_rows, behind_s=behind_s, max_behind_s=2)

    assert outcome([], 100).outcome == WAIT  # nothing compared: no input yet
    assert outcome([check("o", 50)], 10).outcome == WAIT
    assert outcome([check("o", 5)], 40, min_rows=10).outcome == WAIT
    passed = outcome([check("o", 7), check("q", 3)], 40, min_rows=10)
    assert passed.outcome == PASS and "10 rows equal" in passed.line and "0.5s behind" in passed.line
    assert outcome([check("o", 50)], 40, behind_s=6.0).outcome == WAIT  # still catching up: it would pause
    assert outcome([check("o", 50)], 40, behind_s=None).outcome == WAIT  # no batch of its own recorded yet
    differs = outcome([check("o", 7, differing=1), check("q", 3)], 1, min_rows=10, behind_s=None)
    assert differs.outcome == DIFFER and differs.line.startswith("1 of 10 rows differ")
    assert outcome([], 0, verify_s=0, min_rows=0).outcome == PASS


def test_rows_only_in_the_new_version_stop_the_verification_whatever_else_it_compared():
    only = OutputCheck("hot", 0, 0, ["event_id e1 {'room': 'r1'}: only in this version (...)"], unmatched=3)
    judged = verdict([check("per_room", 50), only], 60, verify_s=30, min_rows=10, behind_s=0.0, max_behind_s=2)
    assert judged.outcome == DIFFER and judged.line.startswith("3 rows of hot only in this version"), judged.line
    assert "e.g. event_id e1" in judged.line
    assert twice_published([check("per_room", 50), check("hot", 5, differing=2)]) is None
    assert twice_published([only]) == judged.line


def test_behind_is_the_largest_gap_of_the_queries_watermarks_and_unknown_without_the_shadows():
    t = datetime(2026, 12, 2, 12, tzinfo=timezone.utc)
    active = {"aggregates": t, "quarantine": t - timedelta(seconds=3)}
    assert behind_by(active, {"aggregates": t - timedelta(seconds=4), "quarantine": t}) == 4.0
    assert behind_by(active, {"aggregates": t + timedelta(seconds=1), "quarantine": t}) == -1.0
    assert behind_by(active, {"aggregates": t}) is None
    assert behind_by({}, {}) == 0.0


def test_values_agree_within_a_sums_rounding_and_by_type_otherwise():
    assert same_value(0.1 + 0.2, 0.3) and same_value(Decimal("1.5"), 1.5) and same_value(3, 3.0)
    assert not same_value(1.0, 1.0001) and not same_value(2, 3) and not same_value(None, 0)
    assert same_value(float("nan"), float("nan")) and same_value(memoryview(b"ab"), b"ab")
    assert not same_value(True, 1.0) and same_value("x", "x") and same_value(None, None)


def test_a_row_difference_names_the_identity_and_each_differing_column_old_then_new():
    assert row_difference("s IBM", {"n": 2, "p": 1.0}, {"n": 2, "p": 1.0}, ["n", "p"]) is None
    assert row_difference("s IBM", {"n": 2, "p": 1.0}, {"n": 3, "p": 1.0}, ["n", "p"]) == \
        "s IBM: n 2 (old) != 3 (new)"
    assert row_difference("s IBM", None, {"n": 3}, ["n"]) == "s IBM: only in the new version"


def test_a_batch_is_proven_once_the_active_published_again_after_its_held_rows_were_seen_published():
    """A row the active emits a batch later (a timer its next batch fires) must have had that batch before a row
    held in an earlier batch of the standby counts as only in the new version."""
    from tandem.runtime.verification import QueryVerification

    t = datetime(2026, 12, 7, 9, tzinfo=timezone.utc)

    class Clock:  # the ShadowVerification's two readings of PostgreSQL
        def __init__(self) -> None:
            self.now_at, self.published = t, None

        def now(self):
            return self.now_at

        def active_published_at(self):
            return self.published

    clock = Clock()
    query = QueryVerification(clock, "q")
    assert query.proven_batch() is None
    query.published_through(5)
    clock.published = t  # the publish that showed batch 5's rows: not after they were seen
    assert query.proven_batch() is None
    clock.now_at = t + timedelta(seconds=1)
    query.published_through(7)
    query.published_through(6)  # an older batch seen later changes nothing
    clock.published = t + timedelta(seconds=0.5)  # published again after 5 was seen, before 7 was
    assert query.proven_batch() == 5
    clock.published = t + timedelta(seconds=2)
    assert query.proven_batch() == 7
