"""Pure parts of the presenter: event cursors, key filters, the Params an action becomes, the plugin's entry."""

from __future__ import annotations

import pytest
from tandem.config import ConfigError, load_cluster, load_plan
from tandem.presenter.api import _key_filter, action_conf
from tandem.presenter.models import ActionRequest
from tandem.presenter.views import BadRequest, decode_cursor, encode_cursor, plan_summary
from tandem.store.outputs import START


@pytest.mark.parametrize("position", [START, (1, "a"), (2**63 - 1, "ev:with:colons and spaces/ü"), (42, "")])
def test_a_cursor_stands_for_its_position(position) -> None:
    cursor = encode_cursor(position)
    assert cursor.isascii() and "=" not in cursor and "/" not in cursor and "+" not in cursor
    assert decode_cursor(cursor) == position


@pytest.mark.parametrize("cursor", ["", "not-a-cursor!", encode_cursor((1, "a"))[:-3] + "%%%",
                                    "bm9jb2xvbg", "LTE6YQ", "OTIyMzM3MjAzNjg1NDc3NTgwODph"])
def test_a_cursor_that_is_not_one_is_refused(cursor) -> None:
    """The last three encode "nocolon", "-1:a" and "9223372036854775808:a" (2^63, past xid8's bigint range)."""
    with pytest.raises(BadRequest, match="not a cursor"):
        decode_cursor(cursor)


def test_key_filters_are_field_value_items() -> None:
    assert _key_filter(["symbol:IBM", "symbol:AAPL", "room:a:b"]) == {"symbol": ["IBM", "AAPL"], "room": ["a:b"]}
    assert _key_filter(None) == {}
    for bad in ("symbol", ":IBM"):
        with pytest.raises(BadRequest, match="field:value"):
            _key_filter([bad])


def test_an_action_becomes_the_params_of_its_dag(conf) -> None:
    plan = load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))
    assert action_conf(plan, ActionRequest(action="failover_now", instance="shop-2")) == {
        "action": "failover_now", "plan": "pizza_shop", "instance": "shop-2", "node": ""}
    assert action_conf(plan, ActionRequest(action="upgrade", expect_changes=True))["expect_changes"] is True
    assert action_conf(plan, ActionRequest(action="restore", snapshot_id="s-1", confirm=True, force=True)) == {
        "plan": "pizza_shop", "instance": "", "snapshot_id": "s-1", "node": "", "force": True, "undo_backfills": False,
        "confirm": True}
    with pytest.raises(BadRequest, match="confirm"):
        action_conf(plan, ActionRequest(action="restore"))
    with pytest.raises(BadRequest, match="needs a node"):
        action_conf(plan, ActionRequest(action="drain_node"))
    with pytest.raises(ConfigError, match="not an instance"):
        action_conf(plan, ActionRequest(action="snapshot_now", instance="shop-9"))
    with pytest.raises(ConfigError, match="not a node"):
        action_conf(plan, ActionRequest(action="restart_node", node="node-z"))


def test_an_action_body_may_still_name_the_instance_shard_id() -> None:
    """``shard_id``, the former name of ``instance``, is accepted until the next release; ``instance`` wins."""
    assert ActionRequest.model_validate({"action": "snapshot_now", "shard_id": "shop-2"}).instance == "shop-2"
    both = {"action": "snapshot_now", "instance": "shop-1", "shard_id": "shop-2"}
    assert ActionRequest.model_validate(both).instance == "shop-1"
    assert "shard_id" not in ActionRequest.model_json_schema()["properties"]


def test_a_plan_summary_lists_groups_instances_and_output_columns(conf) -> None:
    summary = plan_summary(load_plan("temperatures", load_cluster(conf / "cluster.yaml")))
    assert [(g.name, g.parallel, g.instances) for g in summary.groups] == [
        ("group-1", 1, ["group-1-1"]), ("group-2", 2, ["group-2-1", "group-2-2"])]
    assert {o.name: o.kind for o in summary.outputs}["temp_alerts"] == "events"


def test_the_plugin_mounts_the_app_and_a_nav_entry() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "plugins" / "tandem_ui" / "__init__.py"
    spec = importlib.util.spec_from_file_location("tandem_ui_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.TandemUIPlugin
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/tandem"
    assert {r.path for r in app["app"].routes} >= {"/", "/api/v1/plans", "/api/v1/plans/{plan}/actions"}
    [view] = plugin.external_views
    assert view["href"] == "/tandem/" and view["url_route"] == "tandem" and view["destination"] == "nav"
