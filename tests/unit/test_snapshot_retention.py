"""Snapshot retention, landing-file retention and the choice of a snapshot to restore, on hand-written rows."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tandem.errors import SnapshotError, SnapshotRefused
from tandem.checkpoints import GUARD_WINDOW_S
from tandem.snapshots.retention import (
    KEEP,
    PRUNE,
    WAIT,
    choose_snapshot,
    decide_landing_retention,
    decide_retention,
    guarding_nodes,
    landing_file_key,
    taking_abandoned,
)
from tandem.store.snapshots import BAD, GOOD, PRUNED, TAKING, SnapshotRecord

UTC = timezone.utc
T0 = datetime(2026, 11, 21, 0, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=10)


def snap(minutes: float, status: str = GOOD, instance: str = "shard-1", plan: str = "trades", name: str | None = None,
         reason: str | None = None) -> SnapshotRecord:
    """A catalog row taken ``minutes`` after T0; its id is ``name`` or ``<status>@<minutes>``."""
    return SnapshotRecord(
        id=name or f"{instance}-{status.lower()}@{minutes:g}", plan=plan, instance=instance,
        instance_id=f"{plan}/{instance}/node-a", node="node-a", taken_at=T0 + timedelta(minutes=minutes),
        checkpoint_path=f"/data/snapshots/{plan}/x", status=status,
        batch_id=None if status == TAKING else int(minutes), reason=reason,
        pruned_at=NOW if status == PRUNED else None)


def actions(plan) -> dict[str, str]:
    return {d.snapshot_id: d.action for d in plan.decisions}


# ------------------------------------------------------------------------------------------------
# Which snapshots to prune


def test_keeps_the_newest_good_snapshots_and_prunes_older_good_ones() -> None:
    rows = [snap(m) for m in (0, 15, 30, 45, 60)]
    plan = decide_retention(rows, keep=3, now=NOW)
    assert actions(plan) == {"shard-1-good@60": KEEP, "shard-1-good@45": KEEP, "shard-1-good@30": KEEP,
                             "shard-1-good@15": PRUNE, "shard-1-good@0": PRUNE}
    assert plan.kept_good("trades", "shard-1") == ("shard-1-good@60", "shard-1-good@45", "shard-1-good@30")
    assert [d.snapshot_id for d in plan.to_prune] == ["shard-1-good@15", "shard-1-good@0"]
    assert "oldest kept: shard-1-good@30" in plan.to_prune[0].reason
    assert plan.decisions[0].reason == "the newest good snapshot of trades/shard-1"


def test_the_input_order_does_not_matter() -> None:
    rows = [snap(m) for m in (30, 0, 60, 15, 45)]
    assert decide_retention(rows, 2, NOW) == decide_retention(sorted(rows, key=lambda r: r.taken_at), 2, NOW)


def test_fewer_good_snapshots_than_keep_are_all_kept() -> None:
    plan = decide_retention([snap(0), snap(15)], keep=3, now=NOW)
    assert set(actions(plan).values()) == {KEEP}


def test_keep_one_keeps_only_the_newest_good() -> None:
    plan = decide_retention([snap(0), snap(15), snap(30)], keep=1, now=NOW)
    assert plan.kept_good("trades", "shard-1") == ("shard-1-good@30",)


@pytest.mark.parametrize("seed", range(200))
def test_the_newest_good_snapshot_is_never_pruned_and_exactly_keep_good_ones_stay(seed: int) -> None:
    rng = random.Random(seed)
    statuses = (GOOD, BAD, TAKING, PRUNED)
    rows = [snap(m, rng.choice(statuses), instance=rng.choice(("shard-1", "shard-2")))
            for m in rng.sample(range(600), rng.randint(0, 12))]
    keep = rng.randint(1, 4)
    plan = decide_retention(rows, keep, NOW)
    for instance in ("shard-1", "shard-2"):
        goods = sorted((r for r in rows if r.status == GOOD and r.instance == instance), key=lambda r: r.taken_at,
                       reverse=True)
        assert plan.kept_good("trades", instance) == tuple(r.id for r in goods[:keep])
        bads_kept = [d for d in plan.decisions if d.instance == instance and d.status == BAD and d.action == KEEP]
        assert len(bads_kept) <= 1
    assert all(d.status != PRUNED for d in plan.decisions)
    assert len(plan.decisions) == sum(r.status != PRUNED for r in rows)


def test_the_newest_bad_snapshot_newer_than_the_oldest_kept_good_is_kept_for_inspection() -> None:
    rows = [snap(0), snap(10, BAD, reason="a"), snap(15), snap(20, BAD, reason="b"), snap(25, BAD, reason="c"),
            snap(30)]
    plan = decide_retention(rows, keep=2, now=NOW)
    assert actions(plan) == {"shard-1-good@30": KEEP, "shard-1-bad@25": KEEP, "shard-1-bad@20": PRUNE,
                             "shard-1-good@15": KEEP, "shard-1-bad@10": PRUNE, "shard-1-good@0": PRUNE}
    reasons = {d.snapshot_id: d.reason for d in plan.decisions}
    assert "kept for inspection" in reasons["shard-1-bad@25"]
    assert "only the newest bad snapshot (shard-1-bad@25)" in reasons["shard-1-bad@20"]
    assert "older than the oldest kept good snapshot shard-1-good@15" in reasons["shard-1-bad@10"]


def test_a_bad_snapshot_older_than_every_kept_good_one_is_pruned() -> None:
    plan = decide_retention([snap(0, BAD), snap(15), snap(30)], keep=2, now=NOW)
    assert actions(plan)["shard-1-bad@0"] == PRUNE


def test_without_any_good_snapshot_only_the_newest_bad_one_stays() -> None:
    plan = decide_retention([snap(0, BAD), snap(15, BAD), snap(30, BAD)], keep=3, now=NOW)
    assert actions(plan) == {"shard-1-bad@30": KEEP, "shard-1-bad@15": PRUNE, "shard-1-bad@0": PRUNE}
    assert "no good snapshot exists" in plan.decisions[0].reason


def test_a_young_taking_snapshot_is_left_alone_and_a_stale_one_is_pruned_as_failed() -> None:
    now = T0 + timedelta(minutes=120)
    rows = [snap(0), snap(50, TAKING), snap(110, TAKING)]
    plan = decide_retention(rows, keep=1, now=now, taking_timeout_s=1800)
    assert actions(plan) == {"shard-1-taking@110": WAIT, "shard-1-taking@50": PRUNE, "shard-1-good@0": KEEP}
    reasons = {d.snapshot_id: d.reason for d in plan.decisions}
    assert reasons["shard-1-taking@110"] == "being taken for 600 s (abandoned after 1800 s)"
    assert reasons["shard-1-taking@50"].startswith("abandoned: still TAKING 4200 s after it started")


def taking(minutes: float, *, progress: float | None, name: str) -> SnapshotRecord:
    """A TAKING row begun ``minutes`` after T0 by pid 77 on host h1, whose taker last beat at ``progress`` minutes
    after T0 (``None``: no taker recorded, an earlier version's row)."""
    return replace(snap(minutes, TAKING, name=name), taker_host=None if progress is None else "h1",
                   taker_pid=None if progress is None else 77,
                   progress_at=None if progress is None else T0 + timedelta(minutes=progress))


@pytest.mark.parametrize(("row", "alive", "abandoned"), [
    (taking(100, progress=119.5, name="beating"), True, None),
    (taking(100, progress=119.5, name="beating, taker elsewhere"), None, None),
    (taking(100, progress=119.5, name="beating, taker gone"), False, "its taker (pid 77 on h1) is gone"),
    (taking(100, progress=117.9, name="silent"), None, "no progress from its taker (pid 77 on h1) for 126 s"),
    (taking(100, progress=117.9, name="silent, taker alive"), True, "for 126 s"),  # hung: beats nothing any more
    (taking(119, progress=None, name="an earlier version's, young"), None, None),
    (taking(50, progress=None, name="an earlier version's, old"), None, "still TAKING 4200 s after it started"),
    (snap(100), False, None),  # only a TAKING snapshot can be abandoned
])
def test_a_taking_snapshot_is_abandoned_once_its_taker_is_gone_or_silent_not_after_an_hour(
        row: SnapshotRecord, alive: bool | None, abandoned: str | None) -> None:
    """Issue 60: a snapshot whose taker died blocked pruning (and the retention of what it may need) for an hour."""
    found = taking_abandoned(row, T0 + timedelta(minutes=120), alive)
    assert found is None if abandoned is None else abandoned in found, found


def test_retention_prunes_a_taking_snapshot_whose_taker_is_gone_and_waits_for_a_beating_one() -> None:
    rows = [snap(0), taking(100, progress=119.5, name="dead"), taking(101, progress=119.5, name="alive")]
    plan = decide_retention(rows, keep=1, now=T0 + timedelta(minutes=120), takers_alive={"dead": False, "alive": True})
    assert actions(plan) == {"alive": WAIT, "dead": PRUNE, "shard-1-good@0": KEEP}


def test_a_taking_snapshot_does_not_count_as_a_good_one() -> None:
    plan = decide_retention([snap(0), snap(15), snap(30, TAKING)], keep=2, now=T0 + timedelta(minutes=31))
    assert actions(plan) == {"shard-1-taking@30": WAIT, "shard-1-good@15": KEEP, "shard-1-good@0": KEEP}


def test_a_taking_snapshot_from_the_future_waits() -> None:
    plan = decide_retention([snap(30, TAKING)], keep=1, now=T0)
    assert plan.decisions[0].action == WAIT
    assert plan.decisions[0].reason.startswith("being taken for 0 s")


def test_pruned_snapshots_are_history_and_count_for_nothing() -> None:
    plan = decide_retention([snap(0), snap(15, PRUNED), snap(30, PRUNED)], keep=2, now=NOW)
    assert actions(plan) == {"shard-1-good@0": KEEP}


def test_instances_and_plans_are_decided_separately() -> None:
    rows = [snap(0), snap(15), snap(5, instance="shard-2"), snap(1, plan="other")]
    plan = decide_retention(rows, keep=1, now=NOW)
    assert actions(plan) == {"shard-1-good@15": KEEP, "shard-1-good@0": PRUNE, "shard-2-good@5": KEEP,
                             "shard-1-good@1": KEEP}
    assert [d.plan for d in plan.decisions] == ["other", "trades", "trades", "trades"]


def test_snapshots_taken_at_the_same_moment_are_ordered_by_id() -> None:
    plan = decide_retention([snap(0, name="a"), snap(0, name="b")], keep=1, now=NOW)
    assert actions(plan) == {"b": KEEP, "a": PRUNE}


def test_describe_names_action_id_status_and_reason() -> None:
    plan = decide_retention([snap(0), snap(15)], keep=1, now=NOW)
    assert plan.describe() == [
        "keep shard-1-good@15 (GOOD): the newest good snapshot of trades/shard-1",
        "prune shard-1-good@0 (GOOD): good, but older than the 1 newest good snapshots of trades/shard-1 "
        "(oldest kept: shard-1-good@15)",
    ]


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "3"])
def test_keep_must_be_at_least_one(keep) -> None:
    with pytest.raises(ValueError, match="keep must be an integer of at least 1"):
        decide_retention([snap(0)], keep, NOW)


def test_now_must_carry_a_zone_and_the_timeout_be_positive() -> None:
    with pytest.raises(ValueError, match="time zone"):
        decide_retention([snap(0)], 1, datetime(2026, 11, 21))
    with pytest.raises(ValueError, match="taking_timeout_s"):
        decide_retention([snap(0)], 1, NOW, taking_timeout_s=0)


# ------------------------------------------------------------------------------------------------
# Which landing files may be deleted

LANDING = "/data/landing/trades/shard-1"


def files(*numbers: int) -> list[str]:
    return [f"{LANDING}/t-{n}.jsonl" for n in numbers]


def test_files_processed_by_every_instance_and_inside_every_kept_cut_may_be_deleted() -> None:
    decision = decide_landing_retention(
        files(1, 2, 3, 4, 5),
        processed_by={"trades/shard-1/node-a": files(1, 2, 3, 4, 5), "trades/shard-1/node-b": files(1, 2, 3, 4)},
        kept_cuts={"snap-old": files(1, 2), "snap-new": files(1, 2, 3)},
    )
    assert decision.delete == tuple(files(1, 2))
    assert decision.keep == {
        files(3)[0]: "after the cut of snapshot snap-old (a restore from it reprocesses this file)",
        files(4)[0]: "after the cuts of snapshots snap-new, snap-old (a restore from them reprocesses this file)",
        files(5)[0]: "not yet processed by trades/shard-1/node-b",
    }


def test_a_newer_cut_that_lags_behind_an_older_one_still_holds_its_files() -> None:
    decision = decide_landing_retention(files(1, 2, 3), processed_by={"a": files(1, 2, 3)},
                                        kept_cuts={"old-from-active": files(1, 2, 3), "new-from-lagging": files(1)})
    assert decision.delete == tuple(files(1))


def test_spark_file_uris_match_plain_paths_and_the_given_form_is_returned() -> None:
    spaced = f"{LANDING}/t 9.jsonl"
    decision = decide_landing_retention(
        [*files(1), spaced],
        processed_by={"a": [f"file://{LANDING}/t-1.jsonl", f"file:{LANDING}/t%209.jsonl"]},
        kept_cuts={"s": [f"file:///{LANDING.lstrip('/')}/t-1.jsonl", f"file://{LANDING}/t%209.jsonl"]},
    )
    assert decision.delete == (spaced, *files(1))


def test_landing_file_key_normalises_uris_and_paths() -> None:
    assert landing_file_key("file:///a/b/c.jsonl") == "/a/b/c.jsonl"
    assert landing_file_key("file:/a/b/c%20d.jsonl") == "/a/b/c d.jsonl"
    assert landing_file_key("/a//b/./c.jsonl") == "/a/b/c.jsonl"


def test_hidden_and_temporary_files_are_never_deleted() -> None:
    temporary = f"{LANDING}/.t-7.jsonl.tmp"
    decision = decide_landing_retention([temporary, f"{LANDING}/_SUCCESS"], processed_by={"a": [temporary]},
                                        kept_cuts={"s": [temporary]})
    assert decision.delete == ()
    assert all(reason.startswith("hidden or temporary file") for reason in decision.keep.values())


def test_nothing_is_deleted_without_an_instance_or_without_a_kept_snapshot() -> None:
    no_instance = decide_landing_retention(files(1), processed_by={}, kept_cuts={"s": files(1)})
    no_snapshot = decide_landing_retention(files(1), processed_by={"a": files(1)}, kept_cuts={})
    assert no_instance.delete == no_snapshot.delete == ()
    assert no_instance.keep[files(1)[0]] == "no instance given: nothing shows the file was processed"
    assert no_snapshot.keep[files(1)[0]] == "no good snapshot kept: a restore from scratch would need every file"


def test_processed_files_that_are_gone_already_are_ignored() -> None:
    decision = decide_landing_retention(files(2), processed_by={"a": files(1, 2)}, kept_cuts={"s": files(1, 2)})
    assert decision.delete == tuple(files(2))
    assert decision.keep == {}


def test_recent_files_nothing_else_needs_leave_landing_for_retained_and_the_others_stay() -> None:
    decision = decide_landing_retention(files(1, 2, 3, 4), processed_by={"a": files(1, 2, 3, 4), "b": files(1, 2, 3)},
                                        kept_cuts={"s": files(1, 2, 3)}, recent=files(2, 3, 4))
    assert decision.delete == tuple(files(1))
    assert decision.retire == tuple(files(2, 3))  # younger than keep_input: a backfill may still read them
    assert decision.keep == {files(4)[0]: "not yet processed by b"}  # recent or not, a reader still needs it
    assert "move 2 file(s) to retained/" in decision.describe()[1]


def test_recent_files_stay_in_landing_while_a_restart_or_a_restore_needs_them() -> None:
    no_snapshot = decide_landing_retention(files(1), processed_by={"a": files(1)}, kept_cuts={}, recent=files(1))
    after_cut = decide_landing_retention(files(1), processed_by={"a": files(1)}, kept_cuts={"s": []},
                                         recent=files(1))
    assert no_snapshot.retire == after_cut.retire == no_snapshot.delete == after_cut.delete == ()


def test_describe_counts_files_per_reason() -> None:
    decision = decide_landing_retention(files(1, 2, 3, 4), processed_by={"a": files(1, 2, 3), "b": files(1, 2)},
                                        kept_cuts={"s": files(1, 2, 3)})
    assert decision.describe() == [
        "delete 2 file(s): processed by every instance and inside every kept snapshot's cut",
        "keep 1 file(s): not yet processed by a, b",
        "keep 1 file(s): not yet processed by b",
    ]


# ------------------------------------------------------------------------------------------------
# Which snapshot a restore uses

ROWS = [snap(0), snap(15), snap(30, BAD, reason="state rows 10 != metadata 12"), snap(45, TAKING),
        snap(5, PRUNED, reason="older than the newest 3 good snapshots")]


def test_by_id_a_good_snapshot_is_chosen() -> None:
    assert choose_snapshot(ROWS, snapshot_id="shard-1-good@0").id == "shard-1-good@0"


def test_a_bad_snapshot_is_refused_unless_forced() -> None:
    with pytest.raises(SnapshotRefused) as caught:
        choose_snapshot(ROWS, snapshot_id="shard-1-bad@30")
    message = str(caught.value)
    assert "shard-1-bad@30 is BAD (state rows 10 != metadata 12)" in message
    assert "--force" in message
    assert choose_snapshot(ROWS, snapshot_id="shard-1-bad@30", force=True).id == "shard-1-bad@30"


@pytest.mark.parametrize(("snapshot_id", "fragment"), [("shard-1-taking@45", "still TAKING"),
                                                       ("shard-1-pruned@5", "was pruned")])
def test_taking_and_pruned_snapshots_are_refused_even_when_forced(snapshot_id: str, fragment: str) -> None:
    for force in (False, True):
        with pytest.raises(SnapshotRefused, match=fragment):
            choose_snapshot(ROWS, snapshot_id=snapshot_id, force=force)


def test_an_unknown_id_names_the_newest_snapshots() -> None:
    with pytest.raises(SnapshotError, match=r"no snapshot 'nope' in the catalog \(newest: shard-1-taking@45, "
                                            r"shard-1-bad@30, shard-1-good@15\)"):
        choose_snapshot(ROWS, snapshot_id="nope")


def test_latest_good_skips_newer_bad_and_taking_snapshots_and_is_the_default() -> None:
    assert choose_snapshot(ROWS, latest_good=True).id == "shard-1-good@15"
    assert choose_snapshot(ROWS).id == "shard-1-good@15"
    assert choose_snapshot(ROWS, latest_good=True, force=True).id == "shard-1-good@15"


def test_latest_good_without_a_good_snapshot_says_what_there_is() -> None:
    rows = [snap(0, BAD), snap(10, BAD), snap(20, TAKING)]
    with pytest.raises(SnapshotError, match=r"no GOOD snapshot of trades/shard-1 \(2 BAD, 1 TAKING\)") as caught:
        choose_snapshot(rows, latest_good=True)
    assert not isinstance(caught.value, SnapshotRefused)
    with pytest.raises(SnapshotError, match="no snapshot in the catalog"):
        choose_snapshot([], latest_good=True)


def test_latest_good_is_per_instance_but_an_id_may_come_from_any_instance() -> None:
    rows = [*ROWS, snap(60, instance="shard-2")]
    with pytest.raises(SnapshotError, match=r"several instances \(trades/shard-1, trades/shard-2\)"):
        choose_snapshot(rows, latest_good=True)
    assert choose_snapshot(rows, snapshot_id="shard-2-good@60").instance == "shard-2"


def test_an_id_and_latest_good_together_are_an_error() -> None:
    with pytest.raises(ValueError, match="not both"):
        choose_snapshot(ROWS, snapshot_id="shard-1-good@0", latest_good=True)


# --- files_of_stream: which sources of a query read a stream -------------------------------------

ORDERS, DELIVERIES = "/data/landing/orders", "/data/landing/deliveries"


def test_a_query_of_two_streams_counts_for_each_stream_with_the_files_of_that_stream_only() -> None:
    from tandem.snapshots.retention import files_of_stream

    by_source = [frozenset({"file:///data/landing/orders/0/a.jsonl"}),
                 frozenset({"file:///data/landing/deliveries/0/b.jsonl", "/data/landing/deliveries/2/c.jsonl"})]
    assert files_of_stream(by_source, ORDERS) == {"/data/landing/orders/0/a.jsonl"}
    assert files_of_stream(by_source, DELIVERIES) == {"/data/landing/deliveries/0/b.jsonl",
                                                      "/data/landing/deliveries/2/c.jsonl"}
    assert files_of_stream(by_source, "/data/landing/temps") is None  # not a reader of that stream
    assert files_of_stream([by_source[0]], "/data/landing/orders_archive") is None  # a prefix is not the stream


def test_a_query_that_has_read_nothing_yet_may_read_any_stream() -> None:
    from tandem.snapshots.retention import files_of_stream

    assert files_of_stream([], ORDERS) == frozenset()  # nothing committed: it has processed nothing
    assert files_of_stream([frozenset({"/data/landing/orders/1/a"}), frozenset()], DELIVERIES) == frozenset()
    assert files_of_stream([None], ORDERS) is None  # not a file source: it guards nothing


def test_the_holder_and_the_nodes_that_beat_or_checkpointed_lately_guard_landing_files() -> None:
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    old = GUARD_WINDOW_S + 1
    beats = {"node-a": 2.0, "node-b": old, "node-c": old}
    changes = {"node-a": 5.0, "node-b": old, "node-c": 30.0, "node-d": old}
    # node-b: killed long ago, not the holder: its next launch re-syncs; node-c: re-synced just now, not beating yet
    assert guarding_nodes(nodes, "node-d", beats, changes) == {"node-a", "node-c", "node-d"}
    # the holder's checkpoint counts however old (it resumes from it)
    assert guarding_nodes(nodes, "node-b", beats, changes) == {"node-a", "node-b", "node-c"}
    assert guarding_nodes(nodes, "node-b", {}, {}) == {"node-b"}


def test_without_a_lease_every_node_guards_landing_files() -> None:
    assert guarding_nodes(["node-a", "node-b"], None, {}, {}) == {"node-a", "node-b"}
