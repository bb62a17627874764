"""The shared-storage check's decisions (pure): which host may start, and which nodes block a plan."""

from __future__ import annotations

from pathlib import Path

from tandem.shared_storage import executor_problems, plan_storage_problems, storage_verdict

MARKER = Path("/shared/tandem/.tandem-storage")


def test_the_first_node_initialises_the_marker() -> None:
    assert storage_verdict(None, None, MARKER, None).action == "initialise"


def test_a_marker_on_disk_without_a_record_is_adopted() -> None:
    """A new coordination database over existing storage (e.g. a restored cluster) records the file's token."""
    assert storage_verdict(None, "abc", MARKER, None).action == "initialise"


def test_the_same_token_on_disk_and_in_postgresql_is_shared_storage() -> None:
    verdict = storage_verdict("abc", "abc", MARKER, "/shared/tandem")
    assert verdict.ok and verdict.action == "ok"


def test_a_host_without_the_marker_is_refused() -> None:
    verdict = storage_verdict("abc", None, MARKER, "/shared/tandem")
    assert not verdict.ok
    assert str(MARKER) in verdict.detail and "missing on this host" in verdict.detail
    assert "NFS" in verdict.detail


def test_a_host_with_another_storage_s_marker_is_refused() -> None:
    verdict = storage_verdict("abc", "xyz", MARKER, "/shared/tandem")
    assert not verdict.ok and "belongs to another storage" in verdict.detail


def test_only_failed_checks_of_the_plan_s_own_nodes_block_it() -> None:
    checks = {
        "node-a": {"host": "h1", "ok": True, "detail": "matches"},
        "node-b": {"host": "h2", "ok": False, "detail": "missing on this host"},
        "node-x": {"host": "h9", "ok": False, "detail": "not this plan's"},
    }
    assert plan_storage_problems(["node-a", "node-b", "node-c"], checks) == ["node-b (host h2): missing on this host"]
    assert plan_storage_problems(["node-a", "node-c"], checks) == []


def test_executor_hosts_that_read_no_marker_or_another_storages_are_named() -> None:
    marker = Path("/shared/tandem/.tandem-storage")
    seen = {"worker-1": "abc", "worker-2": None, "worker-3": "other"}
    problems = executor_problems("abc", seen, marker, "/shared/tandem")
    assert [p.split(":")[0] for p in problems] == ["executor host worker-2", "executor host worker-3"]
    assert "missing on this host" in problems[0] and "belongs to another storage" in problems[1]
    assert executor_problems("abc", {"worker-1": "abc"}, marker, "/shared/tandem") == []
