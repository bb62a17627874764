"""Which versions of a Delta table vacuum must keep for the kept snapshots, which contribution ids may go (pure)."""

from __future__ import annotations

import pytest
from deltalake.exceptions import CommitFailedError

from tandem.lake import maintenance
from tandem.lake.maintenance import kept_versions


def test_the_kept_versions_are_those_snapshots_recorded_for_the_table_once_each_oldest_first() -> None:
    recorded = [{"trades": 40, "quarantine": 7}, {"trades": 12}, {"quarantine": 3}, {"trades": 40}, {"trades": 99}]
    assert kept_versions(recorded, "trades", latest=60) == (12, 40)
    assert kept_versions(recorded, "quarantine", latest=60) == (3, 7)
    assert kept_versions(recorded, "other", latest=60) == ()


def test_a_commit_conflict_is_tried_again_and_the_last_one_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    outcomes = iter([CommitFailedError("conflict"), CommitFailedError("conflict"), "done"])

    def action() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert maintenance.retry_on_conflict(action, waits.append) == ("done", 2)
    assert waits == [0.2, 0.4]

    def always() -> None:
        raise CommitFailedError("conflict")

    with pytest.raises(CommitFailedError):
        maintenance.retry_on_conflict(always, waits.append)


def test_contribution_ids_go_after_the_retention_and_an_hour_before_the_oldest_kept_snapshot() -> None:
    from datetime import datetime, timedelta, timezone

    from tandem.batch.trim import contributions_cutoff

    now = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
    month = 30 * 86400.0
    assert contributions_cutoff(now, month, None) == now - timedelta(days=30)
    assert contributions_cutoff(now, month, now - timedelta(days=2)) == now - timedelta(days=30)
    assert contributions_cutoff(now, month, now - timedelta(days=40)) == now - timedelta(days=40, hours=1)
