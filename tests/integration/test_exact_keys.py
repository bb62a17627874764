"""Instances and plans never leak into each other: exact keys in publish_log and the serving table.

Real PostgreSQL and Delta through the real sinks (no Spark: the sinks take Arrow batches).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from _project import TRADES
from tandem.config import load_cluster
from tandem.layout import delta_table_dir
from tandem.outputs.aggregation import AggregateSink
from tandem.outputs.base import BatchInfo
from tandem.outputs.aggregation import rebuild_postgres_instance
from tandem.store.db import Database
from tandem.store.leases import try_acquire
from tandem.store.migrations import migrate
from tandem.store.publish_log import forget_instance, published_watermark
from tandem.store.registry import InstanceKey
from tandem.reading import read_output

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def seconds(prices: dict[int, list[float]], symbol: str = "IBM") -> pa.Table:
    """Per-second partials (the aggregates query's rows) for ``{second offset: [prices]}``."""
    return pa.Table.from_pylist([
        {"bucket_start": T0 + timedelta(seconds=s), "symbol": symbol, "price_sum": sum(p), "trade_count": len(p),
         "quantity_sum": 10 * len(p), "price_min": min(p), "price_max": max(p)} for s, p in sorted(prices.items())])


def publish(url: str, storage: Path, key: InstanceKey, rows: pa.Table, batch_id: int = 0) -> AggregateSink:
    """Publish one batch as the ACTIVE of ``key`` (takes the lease first)."""
    with Database(url) as db:
        epoch = try_acquire(db, key.plan, key.instance, key.node, ttl_s=30.0)
    sink = AggregateSink(TRADES, key, url, storage / key.plan / TRADES.table, watermark_s=1.0)
    sink.publish(rows, BatchInfo(key, batch_id, epoch, datetime.now(UTC)))
    return sink


@pytest.fixture
def url(database_url: str) -> str:
    with Database(database_url) as db:
        migrate(db)
    return database_url


def test_a_standby_of_instance_1_keeps_what_the_active_of_instance_dash_1_published(url: str, tmp_path: Path) -> None:
    """`_` in a LIKE pattern matches `-`: instance_1's standby trimmed its held rows by shard-1's position."""
    far_ahead = {s: [100.0] for s in range(0, 600, 60)}
    publish(url, tmp_path, InstanceKey("trades", "shard-1", "node-a"), seconds(far_ahead))

    standby = AggregateSink(TRADES, InstanceKey("trades", "instance_1", "node-b"), url,
                            tmp_path / "trades" / TRADES.table, watermark_s=1.0)
    standby.hold(seconds({1: [10.0], 2: [20.0]}), batch_id=0)
    standby.trim()
    assert len(standby.held) == 2, "instance_1's held rows were trimmed by shard-1's published position"

    with Database(url) as db:
        assert published_watermark(db, "trades", "instance_1", TRADES.table) is None
        assert published_watermark(db, "trades", "shard-1", TRADES.table) is not None
        assert forget_instance(db, "trades", "instance_1") == 0
        assert forget_instance(db, "trades", "shard-1") == 1


def test_two_plans_with_the_same_aggregation_keep_their_own_rows(url: str, project: Path) -> None:
    """A second plan running the trades module writes the same table; reads and restores stay per plan."""
    trades_yaml = project / "conf" / "plans" / "trades.yaml"
    (project / "conf" / "plans" / "copy.yaml").write_text(trades_yaml.read_text().replace("name: trades", "name: copy"))
    cluster = load_cluster()
    publish(url, cluster.storage_root / "delta", InstanceKey("trades", "shard-1", "node-a"),
            seconds({0: [100.0, 102.0], 1: [101.0]}))
    publish(url, cluster.storage_root / "delta", InstanceKey("copy", "shard-1", "node-a"),
            seconds({0: [5.0, 6.0, 7.0], 1: [8.0]}))
    window = (T0 - timedelta(days=1), T0 + timedelta(days=1))

    def minute_of(plan: str) -> tuple[int, float]:
        [row] = read_output(cluster, plan, "minute", *window)
        return row["trade_count"], row["price_sum"]

    assert minute_of("trades") == (3, 303.0)
    assert minute_of("copy") == (4, 26.0)

    # restoring the copy's shard-1 to an empty cut deletes the copy's rows, and only those
    with Database(url) as db:
        rebuild_postgres_instance(db, TRADES, "copy", "shard-1", seconds({0: [1.0]}).slice(0, 0))
    assert read_output(cluster, "copy", "minute", *window) == []
    assert minute_of("trades") == (3, 303.0)
    assert (delta_table_dir(cluster, "copy", TRADES.table)).is_dir()
