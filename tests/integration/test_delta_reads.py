"""Reading Delta never aborts the process at exit (issue 9, item 15).

``DeltaTable.to_pyarrow_dataset()`` left scanner threads that raced the interpreter's exit: about
one ``tandem query … --source delta`` in two ended with "terminate called without an active
exception", exit 134, even though its output was complete. At that rate twenty runs all pass
by chance once in a million.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from _project import TRADES
from tandem.config import load_cluster
from tandem.layout import delta_table_dir
from tandem.outputs.aggregation import AggregateSink
from tandem.outputs.base import BatchInfo
from tandem.store.db import Database
from tandem.store.leases import try_acquire
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = datetime(2026, 2, 1, 9, 0, 0, tzinfo=UTC)
RUNS = 20
BATCHES = 12


def test_the_cli_reads_delta_twenty_times_and_exits_0_every_time(project: Path) -> None:
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
    prices = {(minute, symbol): [10.0 + minute + i for i in range(1 + minute % 3)]
              for minute in range(BATCHES) for symbol in ("IBM", "WSO2")}
    for instance in ("shard-1", "shard-2"):  # each instance saw the same trades: merged counts double
        key = InstanceKey("trades", instance, "node-a")
        with Database(cluster.database_url) as db:
            epoch = try_acquire(db, "trades", instance, "node-a", ttl_s=600.0)
        sink = AggregateSink(TRADES, key, cluster.database_url, delta_table_dir(cluster, "trades", TRADES.table), 1.0)
        for batch in range(BATCHES):  # one micro-batch per minute: a table of many small files, as a plan makes
            rows = pa.Table.from_pylist([
                {"bucket_start": T0 + timedelta(minutes=batch), "symbol": symbol, "price_sum": sum(p),
                 "trade_count": len(p), "quantity_sum": len(p), "price_min": min(p), "price_max": max(p)}
                for (minute, symbol), p in sorted(prices.items()) if minute == batch])
            sink.publish(rows, BatchInfo(key, batch, epoch, datetime.now(UTC)))
    expected = {(T0 + timedelta(minutes=minute), symbol): (2 * len(p), 2 * sum(p))
                for (minute, symbol), p in prices.items()}

    argv = [sys.executable, "-m", "tandem.cli", "query", "trades", "--granularity", "minute", "--source", "delta",
            "--start", T0.isoformat(), "--end", (T0 + timedelta(hours=1)).isoformat(), "--json"]
    failures = []
    for run in range(RUNS):
        done = subprocess.run(argv, env=dict(os.environ), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            failures.append(f"run {run}: exit {done.returncode}: {done.stderr.strip()[-200:]}")
            continue
        got = {(datetime.fromisoformat(r["bucket_start"]), r["symbol"]): (r["trade_count"], r["price_sum"])
               for r in json.loads(done.stdout)}
        assert got == expected, f"run {run}: {got}"
    assert failures == [], f"{len(failures)} of {RUNS} reads ended badly: {failures[:3]}"


READ_AND_EXIT = """
import sys
from pathlib import Path
import pyarrow.dataset as ds
from tandem.lake.tables import read_table
table = read_table(Path(sys.argv[1]), ds.field("granularity") == "second")
print(table.num_rows)
"""


def test_a_process_that_exits_right_after_reading_delta_never_aborts(tmp_path: Path) -> None:
    """The worst case of the race: nothing happens between the read and the interpreter's exit."""
    path = tmp_path / "table"
    for batch in range(20):
        write_deltalake(str(path), pa.table({"granularity": ["second"] * 500, "key": list(range(500)),
                                             "batch": [batch] * 500}), mode="append", partition_by=["granularity"])
    outcomes = [subprocess.run([sys.executable, "-c", READ_AND_EXIT, str(path)], capture_output=True, text=True,
                               timeout=60) for _ in range(RUNS)]
    aborted = [o.stderr.strip()[-120:] for o in outcomes if o.returncode != 0]
    assert aborted == [], f"{len(aborted)} of {RUNS} processes ended badly, e.g. {aborted[:2]}"
    assert {o.stdout.strip() for o in outcomes} == {"10000"}
