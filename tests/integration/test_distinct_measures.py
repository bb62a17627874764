"""Distinct measures: Spark's HLL sketches per instance and second, unioned across instances and up to every
granularity, in PostgreSQL reads and Delta reads alike, within the sketches' error bound of the
exact counts the test computes."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.spark import second_partials
from tandem.aggregation.spec import AggregationSpec, Measure
from tandem.outputs.aggregation import AggregateSink
from tandem.outputs.base import BatchInfo
from tandem.store import Database, migrate
from tandem.store.leases import try_acquire
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = datetime(2025, 12, 31, 23, 58, tzinfo=UTC)
SPEC = AggregationSpec(name="visits", table="test_visits", keys=("site",), measures=(
    Measure("visits", "count", "bigint"), Measure("visitors", "distinct", "bytea", "user")))
ERROR_BOUND = 3 * 1.04 / 2 ** 6  # three standard errors of an lgK = 12 sketch: 4.9 %


def test_distinct_estimates_merge_across_instances_and_granularities(spark, database_url: str, tmp_path: Path) -> None:
    rng = random.Random(4)
    events = [(rng.choice(["a", "b"]), f"u{int(rng.paretovariate(1.2) * 10)}", T0 + timedelta(milliseconds=rng.randint(0, 240_000)))
              for _ in range(30_000)]
    with Database(database_url) as db:
        migrate(db)
        for index, instance in enumerate(("s-1", "s-2")):
            part = events[index::2]
            frame = spark.createDataFrame([(s, u, t) for s, u, t in part], "site string, user string, event_time timestamp")
            rows = second_partials(frame, SPEC, None).toArrow()
            key = InstanceKey("web", instance, "node-a")
            epoch = try_acquire(db, "web", instance, "node-a", 30.0)
            sink = AggregateSink(SPEC, key, database_url, tmp_path / "visits", watermark_s=1.0)
            sink.publish(rows, BatchInfo(key, 0, epoch, datetime.now(UTC)))

        checked = 0
        for granularity in ("second", "minute", "hour", "day", "year"):
            exact: dict[tuple, set[str]] = {}
            counts: dict[tuple, int] = {}
            for site, user, moment in events:
                group = (bucket_start(moment, granularity), site)
                exact.setdefault(group, set()).add(user)
                counts[group] = counts.get(group, 0) + 1
            window = (T0 - timedelta(days=400), T0 + timedelta(days=400))
            served = db.run(lambda cursor: agg_postgres.query_merged(cursor, SPEC, "web", granularity, *window))
            lake = agg_delta.query_merged(tmp_path / "visits", SPEC, granularity, *window)
            for rows in (served, lake):
                got = {(r["bucket_start"], r["site"]): r for r in rows}
                assert set(got) == set(exact), granularity
                for group, users in exact.items():
                    assert got[group]["visits"] == counts[group]
                    assert got[group]["instances"] == 2 or counts[group] < 4
                    assert abs(got[group]["visitors"] - len(users)) <= max(1.0, ERROR_BOUND * len(users)), \
                        (granularity, group, got[group]["visitors"], len(users))
                    checked += 1
    assert checked > 100
