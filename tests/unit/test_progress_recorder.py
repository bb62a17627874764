"""Which queries' progress an instance's listener records (pure: the query name only)."""

from __future__ import annotations

from tandem.runtime.listener import own_query_name
from tandem.store.registry import InstanceKey

PIZZA = InstanceKey("pizza_shop", "shop-1", "node-a")


def test_the_listener_records_only_its_own_instances_queries() -> None:
    assert own_query_name(PIZZA, "pizza_shop/shop-1/node-a:orders") == "orders"
    assert own_query_name(PIZZA, "pizza_shop/shop-1/node-a:aggregates") == "aggregates"
    # another instance's query of the same name in the same Spark session (one still stopping), a backfill's
    # recomputation, a query without a name: none of them is this instance's progress
    assert own_query_name(PIZZA, "trades/shard-1/node-a:aggregates") is None
    assert own_query_name(PIZZA, "pizza_shop/shop-1/node-b:orders") is None
    assert own_query_name(PIZZA, "backfill:pizza_shop/shop-1:orders") is None
    assert own_query_name(PIZZA, None) is None
    assert own_query_name(PIZZA, "pizza_shop/shop-1/node-a:") is None
