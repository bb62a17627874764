"""``tandem run``'s summary of the run that ended: what each query read, what each output published, what was
quarantined, and the final state last (as before)."""

from __future__ import annotations

from pathlib import Path

from tandem.config import load_cluster
from tandem.runtime.run_summary import RunSummary
from tandem.store import Database, migrate
from tandem.store.heartbeats import BatchProgress, current_run_totals, record_progress
from tandem.store.registry import register_nodes

QUERIES = [{"query_name": "aggregates", "batches": 2, "input_rows": 1083, "quarantined_rows": None},
           {"query_name": "quarantine", "batches": 1, "input_rows": 83, "quarantined_rows": 6}]
OUTPUTS = [{"output": "trade_aggregates", "batches": 1, "rows": 40}]


def test_the_summary_says_what_was_read_published_and_quarantined_and_ends_with_the_state() -> None:
    assert RunSummary("trades/shard-2/node-a", "STOPPED", None, QUERIES, OUTPUTS).lines() == [
        "trades/shard-2/node-a: this run",
        "  read:        aggregates 1,083 rows in 2 batches; quarantine 83 rows in 1 batch",
        "  published:   trade_aggregates 40 rows in 1 batch",
        "  quarantined: 6 lines (by quarantine)",
        "STOPPED",
    ]


def test_a_run_that_ran_no_batch_says_so_and_keeps_its_error() -> None:
    lines = RunSummary("trades/shard-1/node-a", "FAILED", "PlanChanged: refused", [], []).lines()
    assert lines[1:] == ["  read:        nothing (no batch ran)", "  published:   nothing", "FAILED PlanChanged: refused"]


def _progress(node: str, query: str, batch: int, rows: int, quarantined: int | None) -> BatchProgress:
    return BatchProgress(instance_id=f"trades/shard-1/{node}", plan="trades", instance="shard-1", node=node,
                         query_name=query, query_id="00000000-0000-0000-0000-000000000001",
                         run_id="00000000-0000-0000-0000-000000000002", batch_id=batch, input_rows=rows,
                         input_rows_per_s=None, processed_rows_per_s=None, batch_duration_ms=1, watermark=None,
                         state_rows=None, late_rows=None, quarantined_rows=quarantined)


def test_the_totals_are_of_the_current_run_of_the_instance_only(project: Path, database_url: str) -> None:
    """Rows before the run's start (an earlier run) and of another node are not counted."""
    with Database(database_url) as db:
        migrate(db)
        register_nodes(db, load_cluster())

        def start(cur) -> None:
            for node in ("node-a", "node-b"):
                cur.execute("""INSERT INTO plan_instances (instance_id, plan, instance, node, status, started_at)
                               VALUES (%s, 'trades', 'shard-1', %s, 'RUNNING', now())""",
                            (f"trades/shard-1/{node}", node))

        record_progress(db, _progress("node-a", "aggregates", 0, 1000, None))  # the earlier run
        db.run(lambda cur: cur.execute("""INSERT INTO publish_log (instance_id, plan, instance, node, output,
                                              batch_id, epoch, rows)
                                          VALUES ('trades/shard-1/node-a', 'trades', 'shard-1', 'node-a',
                                                  'trade_aggregates', 0, 1, 500)"""))
        db.run(lambda cur: cur.execute("SELECT pg_sleep(0.01)"))
        db.run(start)
        for batch, rows in ((1, 30), (2, 12)):
            record_progress(db, _progress("node-a", "aggregates", batch, rows, None))
        record_progress(db, _progress("node-a", "quarantine", 1, 42, 3))
        record_progress(db, _progress("node-b", "quarantine", 1, 42, 3))
        db.run(lambda cur: cur.execute("""INSERT INTO publish_log (instance_id, plan, instance, node, output,
                                              batch_id, epoch, rows)
                                          VALUES ('trades/shard-1/node-a', 'trades', 'shard-1', 'node-a',
                                                  'trade_aggregates', 1, 2, 7),
                                                 ('trades/shard-1/node-a', 'trades', 'shard-1', 'node-a',
                                                  'trade_aggregates', 2, 2, 5)"""))
        queries, outputs = current_run_totals(db, "trades/shard-1/node-a")
    assert queries == [{"query_name": "aggregates", "batches": 2, "input_rows": 42, "quarantined_rows": None},
                       {"query_name": "quarantine", "batches": 1, "input_rows": 42, "quarantined_rows": 3}]
    assert outputs == [{"output": "trade_aggregates", "batches": 2, "rows": 12}]
