"""Every output kind's sink takes one micro-batch of 100,000 rows over as many keys (issue 46 §1), on real
PostgreSQL and Delta, and publishes exactly what a plain-Python reference computes from the input.

A backlog makes such a batch (a catch-up, a standby's flush); the fact aggregation's first one failed with "stack
depth limit exceeded" (one ``IN`` list of every bucket). ``bench/big_batches.py`` runs the same at 1,000,000 rows.
The aggregations keep two granularities here (the bench, all six), to hold the module to a minute on two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _big_batches import KINDS, BigBatches, batch_info, batch_of
from _project import migrated_database


pytestmark = pytest.mark.integration
ROWS = 100_000
RUN = BigBatches(granularities=("second", "hour"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """One database and one Delta root for the module (every kind writes its own outputs)."""
    with migrated_database() as db:
        yield db, tmp_path_factory.mktemp("big")


@pytest.mark.parametrize("kind", KINDS)
def test_one_batch_of_100000_rows_over_as_many_keys_is_published_exactly(kind: str, store) -> None:
    db, root = store
    batch = batch_of(kind, ROWS)
    sink = RUN.sink(kind, db.url, root)

    sink.publish(batch, batch_info(db))

    expected = RUN.reference(kind, batch)
    assert len(expected) == ROWS * (len(RUN.granularities) if kind.endswith("aggregation") else 1)
    assert RUN.published(kind, db, root) == expected
    if kind in ("fact_aggregation", "table", "events"):  # every id once, and marked as in the lake
        found = RUN.totals(kind, db, root)
        assert (found["ids"], found["in_lake"]) == (ROWS, ROWS)
    if kind == "latest":  # every key's row once, and marked as in the lake
        found = RUN.totals(kind, db, root)
        assert (found["kept"], found["in_lake"]) == (ROWS, ROWS)


def test_a_standby_holds_a_batch_of_100000_quarantined_files_and_trims_it_by_the_lake(store) -> None:
    db, root = store
    batch = batch_of("quarantine", ROWS)
    active, standby = RUN.sink("quarantine", db.url, root / "held"), RUN.sink("quarantine", db.url, root / "held")

    standby.hold(batch, 0)
    assert len(standby.held) == ROWS
    active.publish(batch, batch_info(db))
    standby.trim()
    assert standby.held == {}
