"""Great Expectations validation of the serving table, on rows written to a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pytest
from _project import without_suites

from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError
from tandem.quality import ValidationReport, validate_serving_table
from tandem.quality.suites import ValidationError
from tandem.store import Database, migrate

pytestmark = pytest.mark.integration
UTC = timezone.utc
BUCKET = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
COLUMNS = ("plan", "granularity", "bucket_start", "symbol", "instance", "price_sum", "trade_count", "quantity_sum",
           "price_min", "price_max", "batch_id")


@pytest.fixture
def cluster(project: Path):
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
    return cluster


def insert(database_url: str, *rows: dict) -> None:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
        for row in rows:
            values = {"plan": "trades", "granularity": "hour", "bucket_start": BUCKET, "batch_id": 0, **row}
            cursor.execute(
                f"INSERT INTO tandem.trade_aggregates ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join(['%s'] * len(COLUMNS))})", [values[c] for c in COLUMNS])
    conn.close()


def good(symbol: str, instance: str, prices: list[float], **overrides) -> dict:
    return {"symbol": symbol, "instance": instance, "price_sum": sum(prices), "trade_count": len(prices),
            "quantity_sum": 10 * len(prices), "price_min": min(prices), "price_max": max(prices), **overrides}


GOOD_ROWS = (
    good("IBM", "shard-1", [100.25, 101.5, 99.75]),
    good("IBM", "shard-2", [98.0, 102.0]),
    good("WSO2", "shard-1", [0.1, 0.1, 0.1]),   # sum/count lands an ulp above max: tolerated
    good("ORCL", "shard-2", [55.5]),
    {**good("ORCL", "shard-1", [60.0, 61.0]), "granularity": "minute", "bucket_start": BUCKET + timedelta(minutes=5)},
)


def test_good_rows_pass(cluster, database_url):
    insert(database_url, *GOOD_ROWS)
    report = validate_serving_table(cluster, "trades")
    assert report.success, report.summary()
    assert report.row_count == len(GOOD_ROWS)
    assert report.failures == []
    assert len(report.outcomes) >= 12
    assert "PASSED" in report.summary()
    json.dumps(report.to_dict())  # JSON-able for XCom


def test_granularity_and_window_restrict_the_rows(cluster, database_url):
    insert(database_url, *GOOD_ROWS)
    assert validate_serving_table(cluster, "trades", "minute").row_count == 1
    later = BUCKET + timedelta(hours=2)
    assert validate_serving_table(cluster, "trades", since=later).row_count == 0
    # a bucket counts when it overlaps the window: the hour bucket ends after BUCKET + 30 min
    assert validate_serving_table(cluster, "trades", "hour", since=BUCKET + timedelta(minutes=30)).row_count == 4


def only_failure(report: ValidationReport):
    assert not report.success
    assert len(report.failures) == 1, report.summary()
    return report.failures[0]


def test_average_above_max_fails_the_upper_bound_expectation(cluster, database_url):
    insert(database_url, *GOOD_ROWS, good("MSFT", "shard-1", [10.0, 20.0], price_sum=90.0))  # avg 45 > max 20
    failure = only_failure(validate_serving_table(cluster, "trades"))
    assert failure.expectation == "expect_column_pair_values_a_to_be_greater_than_b"
    assert (failure.kwargs["column_A"], failure.kwargs["column_B"]) == ("price_max", "avg_price")
    assert failure.unexpected_count == 1
    sample = failure.samples[0]
    assert sample["symbol"] == "MSFT" and sample["instance"] == "shard-1"
    assert sample["avg_price"] == 45.0 and sample["price_max"] == 20.0


def test_average_below_min_fails_the_lower_bound_expectation(cluster, database_url):
    insert(database_url, *GOOD_ROWS, good("AAPL", "shard-2", [10.0, 20.0], price_sum=4.0))  # avg 2 < min 10
    report = validate_serving_table(cluster, "trades")
    failure = only_failure(report)
    assert (failure.expectation, failure.kwargs["column_A"], failure.kwargs["column_B"]) == (
        "expect_column_pair_values_a_to_be_greater_than_b", "avg_price", "price_min")
    assert failure.samples[0]["symbol"] == "AAPL" and failure.samples[0]["avg_price"] == 2.0
    text = report.summary()
    assert "FAILED" in text and "column_A=avg_price" in text and '"symbol": "AAPL"' in text


def test_zero_count_fails_the_trade_count_expectation(cluster, database_url):
    insert(database_url, *GOOD_ROWS, good("TSLA", "shard-1", [5.0], trade_count=0))
    failure = only_failure(validate_serving_table(cluster, "trades"))
    assert failure.expectation == "expect_column_values_to_be_between"
    assert failure.kwargs["column"] == "trade_count"
    assert failure.samples[0]["trade_count"] == 0 and failure.samples[0]["symbol"] == "TSLA"


def test_unknown_instance_fails_the_instance_set_expectation_with_the_plans_instances(cluster, database_url):
    insert(database_url, *GOOD_ROWS, good("NVDA", "shard-9", [7.0, 8.0]))
    report = validate_serving_table(cluster, "trades")
    failure = only_failure(report)
    assert failure.expectation == "expect_column_values_to_be_in_set"
    assert failure.kwargs["column"] == "instance"
    assert failure.kwargs["value_set"] == list(load_plan("trades", cluster).instances)
    assert failure.samples[0]["instance"] == "shard-9" and failure.samples[0]["symbol"] == "NVDA"
    assert "shard-9" in report.summary()


def test_several_bad_rows_each_fail_their_own_expectation(cluster, database_url):
    insert(database_url, *GOOD_ROWS,
           good("MSFT", "shard-1", [10.0, 20.0], price_sum=90.0),
           good("TSLA", "shard-1", [5.0], trade_count=0),
           good("NVDA", "shard-9", [7.0, 8.0]))
    report = validate_serving_table(cluster, "trades")
    assert not report.success
    assert report.failure("expect_column_pair_values_a_to_be_greater_than_b", column_A="price_max") is not None
    assert report.failure("expect_column_values_to_be_between", column="trade_count") is not None
    assert report.failure("expect_column_values_to_be_in_set", column="instance") is not None
    assert report.failure("expect_column_pair_values_a_to_be_greater_than_b", column_A="avg_price") is None
    assert len(report.failures) == 3


def test_an_empty_window_passes_and_writes_no_files(cluster, project):
    before = {p for p in project.rglob("*")}
    cwd_before = set(Path.cwd().iterdir())
    report = validate_serving_table(cluster, "trades")
    assert report.success and report.row_count == 0
    assert {p for p in project.rglob("*")} == before
    assert set(Path.cwd().iterdir()) == cwd_before


def test_missing_suite_is_a_clear_error(cluster, project):
    plan = load_plan("trades", cluster)
    (project / "conf" / "expectations" / "trades_aggregates.json").unlink()
    with pytest.raises(ValidationError, match="trades_aggregates.json: expectation suite not found"):
        validate_serving_table(cluster, plan)  # deleted after the plan was loaded
    with pytest.raises(ConfigError, match="trades.yaml: validation.suite: no suite 'trades_aggregates'"):
        validate_serving_table(cluster, "trades")


# --- events and tables (pizza_shop): generated expectations plus the plan's suite -----------------

def publish_pizza(database_url: str, overdue: list[dict], delivered: dict[str, tuple[str, str]],
                  instance: str = "shop-1") -> None:
    """Overdue order events, and on-time orders ``{order_no: (customer, instance)}`` applied to the table."""
    from tandem.declarations import event_id
    from tandem.store.outputs import apply_contributions, insert_events
    from tandem.store.registry import InstanceKey

    with Database(database_url) as db:
        def work(cursor) -> None:
            key = InstanceKey("pizza_shop", instance, "node-a")
            insert_events(cursor, key, "overdue_orders", {
                event_id("pizza_shop", "overdue_orders", {"order_no": e["order_no"]}):
                    (datetime.fromtimestamp(e["expiry_time"] / 1000, UTC), e) for e in overdue}, 1, 0)
            for order_no, (customer, on) in delivered.items():
                apply_contributions(cursor, InstanceKey("pizza_shop", on, "node-a"), "delivered_orders", ["delivered"],
                                    {order_no: ({"customer_name": customer}, {"delivered": 1})}, 1, 0)
        db.run(work)


def overdue(order_no: str, customer: str | None, order_time: int, expiry_time: int) -> dict:
    return {"order_no": order_no, "customer_name": customer, "order_time": order_time, "expiry_time": expiry_time}


def test_events_and_tables_are_validated_by_the_plan_and_its_suite(cluster, database_url):
    from tandem.quality.outputs import validate_plan_outputs

    plan = load_plan("pizza_shop", cluster)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    publish_pizza(database_url, [overdue("o-1", "alice", now_ms - 90_000, now_ms - 60_000),
                                 overdue("o-2", "bob", now_ms - 80_000, now_ms - 50_000)],
                  {"o-3": ("alice", "shop-1"), "o-4": ("alice", "shop-2"), "o-5": ("carol", "shop-1")})
    since = datetime.now(UTC) - timedelta(hours=1)
    reports = {r.suite: r for r in validate_plan_outputs(cluster, plan, since)}
    assert set(reports) == {"pizza_shop_outputs:overdue_orders", "pizza_shop_outputs:delivered_orders",
                            "pizza_shop_outputs:order_stats", "pizza_shop_outputs:last_orders"}
    assert reports["pizza_shop_outputs:order_stats"].row_count == 0  # nothing aggregated yet: its table is not there
    assert reports["pizza_shop_outputs:last_orders"].success and reports["pizza_shop_outputs:last_orders"].row_count == 0
    with pytest.raises(ValidationError, match="order_stats keeps second, minute, hour, day"):
        validate_plan_outputs(cluster, plan, since, granularity="year")  # a bucket the output does not keep
    events, table = reports["pizza_shop_outputs:overdue_orders"], reports["pizza_shop_outputs:delivered_orders"]
    assert events.success and events.row_count == 2, events.summary()
    assert table.success and table.row_count == 3, table.summary()  # alice in two instances, carol in one

    # an event without its customer, expiring before it was placed; a table row of an unknown instance
    publish_pizza(database_url, [overdue("o-9", None, now_ms - 10_000, now_ms - 20_000)], {"o-8": ("dave", "shop-7")})
    reports = {r.suite: r for r in validate_plan_outputs(cluster, plan, since)}
    events, table = reports["pizza_shop_outputs:overdue_orders"], reports["pizza_shop_outputs:delivered_orders"]
    failed = {(o.expectation, o.kwargs.get("column") or o.kwargs.get("column_A")) for o in events.failures}
    assert failed == {("expect_column_values_to_not_be_null", "customer_name"),
                      ("expect_column_pair_values_a_to_be_greater_than_b", "expiry_time")}, events.summary()
    bad = table.failure("expect_column_values_to_be_in_set", column="instance")
    assert bad is not None and bad.unexpected_count == 1, table.summary()


# --- a plan without suite files: the suites its declarations imply -------------------------------------------

def failed(report) -> set[tuple[str, str | None]]:
    """The failed expectations of a report or a snapshot's verdict, with the column each checks."""
    return {(o.expectation, o.kwargs.get("column") or o.kwargs.get("column_A")) for o in report.outcomes
            if not o.success}


def test_trades_without_a_suite_file_validates_its_serving_table_with_the_implied_suite(cluster, project,
                                                                                        database_url):
    without_suites(project / "conf", "trades")
    plan = load_plan("trades", cluster)
    assert plan.validation.suite is None
    insert(database_url, *GOOD_ROWS)  # one average an ulp above its max: snapped, as with the file
    report = validate_serving_table(cluster, plan)
    assert report.success and report.row_count == len(GOOD_ROWS), report.summary()
    assert report.suite == "trades_outputs (implied)" and len(report.outcomes) == 15

    insert(database_url, good("MSFT", "shard-1", [10.0, 20.0], price_sum=90.0),  # avg 45 > max 20
           good("TSLA", "shard-2", [5.0], trade_count=0), good("NVDA", "shard-9", [7.0, 8.0]))
    report = validate_serving_table(cluster, plan)
    assert failed(report) == {("expect_column_pair_values_a_to_be_greater_than_b", "price_max"),
                              ("expect_column_values_to_be_between", "trade_count"),
                              ("expect_column_values_to_be_in_set", "instance")}, report.summary()


def insert_order_stats(database_url: str, *rows: tuple[str, str, int]) -> None:
    """Partial rows ``(granularity, instance, orders)`` of pizza_shop's order_stats, in the table its spec makes."""
    from tandem.store.aggregates import ensure_table
    from tandem.aggregation.spec import spec_for

    spec = spec_for(load_plan("pizza_shop"), "order_stats")
    with Database(database_url) as db:
        def work(cursor) -> None:
            ensure_table(cursor, spec)
            for granularity, instance, orders in rows:
                cursor.execute(f"INSERT INTO {spec.table} (plan, granularity, bucket_start, instance, orders, on_time, "
                               "epoch, batch_id) VALUES ('pizza_shop', %s, %s, %s, %s, 0, 1, 0)",
                               (granularity, BUCKET, instance, orders))
        db.run(work)


def insert_last_orders(database_url: str, *rows: tuple[str | None, str, int]) -> None:
    """Rows ``(customer, instance, order time in ms)`` of pizza_shop's last_orders, as its sink keeps them."""
    with Database(database_url) as db:
        db.run(lambda cursor: cursor.executemany(
            "INSERT INTO output_latest (plan, output, key, instance, event_time, tiebreak, row, node, epoch, batch_id) "
            "VALUES ('pizza_shop', 'last_orders', %s, %s, to_timestamp(%s / 1000.0), 't', %s, 'node-a', 1, 0)",
            [(json.dumps({"customer_name": customer}), instance, at,
              json.dumps({"customer_name": customer, "order_time": at, "order_no": f"o-{at}", "outcome": "overdue",
                          "delivered": 0})) for customer, instance, at in rows]))


def test_pizza_shop_without_suite_files_validates_every_output_with_the_implied_suite(cluster, project,
                                                                                      database_url):
    from tandem.quality.outputs import validate_plan_outputs

    without_suites(project / "conf", "pizza_shop")
    plan = load_plan("pizza_shop", cluster)
    assert (plan.validation.suite, plan.snapshot.suite) == (None, None)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    since = BUCKET  # the order_stats rows' bucket (set when the module loads: a long suite runs this much later)
    # what the suite file checked and the declarations do not imply (a customer, expiry after order) passes
    publish_pizza(database_url, [overdue("o-1", "alice", now_ms - 90_000, now_ms - 60_000),
                                 overdue("o-2", None, now_ms - 10_000, now_ms - 20_000)],
                  {"o-3": ("alice", "shop-1"), "o-4": ("alice", "shop-2")})
    insert_order_stats(database_url, ("hour", "shop-1", 2), ("minute", "shop-2", 1))
    insert_last_orders(database_url, ("alice", "shop-1", now_ms - 90_000), ("bob", "shop-2", now_ms - 80_000))
    reports = {r.suite: r for r in validate_plan_outputs(cluster, plan, since)}
    assert set(reports) == {f"pizza_shop_outputs (implied):{o}" for o in ("overdue_orders", "delivered_orders",
                                                                          "order_stats", "last_orders")}
    assert all(r.success and r.row_count == 2 for r in reports.values()), [r.summary() for r in reports.values()]

    # a null key in each output, a count of 0, a granularity the output does not keep, an unknown instance
    publish_pizza(database_url, [overdue(None, "bob", now_ms - 5_000, now_ms - 1_000)], {"o-8": (None, "shop-1")})
    insert_order_stats(database_url, ("month", "shop-7", 0))
    insert_last_orders(database_url, (None, "shop-9", now_ms - 5_000))
    reports = {r.suite.rpartition(":")[2]: r for r in validate_plan_outputs(cluster, plan, since)}
    assert failed(reports["overdue_orders"]) == {("expect_column_values_to_not_be_null", "order_no")}
    assert failed(reports["delivered_orders"]) == {("expect_column_values_to_not_be_null", "customer_name")}
    assert failed(reports["order_stats"]) == {("expect_column_values_to_be_between", "orders"),
                                              ("expect_column_values_to_be_in_set", "granularity"),
                                              ("expect_column_values_to_be_in_set", "instance")}
    assert failed(reports["last_orders"]) == {("expect_column_values_to_not_be_null", "customer_name"),
                                              ("expect_column_values_to_be_in_set", "instance")}


def test_a_snapshot_of_a_plan_without_a_state_suite_is_validated_with_the_implied_one(cluster, project):
    import pyarrow as pa

    from tandem.snapshots.state_export import STATE_SCHEMA, StateOperator
    from tandem.snapshots.validation import validate_snapshot

    without_suites(project / "conf", "trades")
    plan = load_plan("trades", cluster)
    assert plan.snapshot.suite is None

    def validate(*rows: tuple[int, int, str | None]):
        """State rows ``(partition, batch, key)`` of a cut at batch 7 of an operator with 2 partitions."""
        table = pa.Table.from_pylist([{
            "snapshot_id": "s", "plan": "trades", "instance": "shard-1", "instance_id": "trades/shard-1/node-a",
            "query": "aggregates", "operator_id": 0, "operator_name": "stateStoreSave", "store_name": "default",
            "partition_id": partition, "batch_id": batch, "key": key, "value": "{}"}
            for partition, batch, key in rows], schema=STATE_SCHEMA)
        return validate_snapshot(cluster, plan, "s", project / "no-cut", {"aggregates": 7}, table, pa.table({}),
                                 {"aggregates": [StateOperator(0, "stateStoreSave", "default", 2, 0, 7)]}, 2)

    good_state = validate((0, 7, '{"symbol": "IBM"}'), (1, 7, '{"symbol": "ORCL"}'))
    assert good_state.suite == "trades_state (implied)" and good_state.rows == 2
    assert good_state.file_problems and all(o.success for o in good_state.outcomes), good_state.summary()
    bad = validate((0, 7, '{"symbol": "IBM"}'), (2, 6, None), (1, 7, '{"symbol": "IBM"}'))
    assert failed(bad) == {("expect_table_row_count_to_equal", None),
                           ("expect_column_values_to_not_be_null", "key"),
                           ("expect_column_values_to_be_between", "partition_id"),
                           ("expect_column_pair_values_to_be_equal", "batch_id"),
                           ("expect_compound_columns_to_be_unique", None)}, bad.summary()
