"""Every broken configuration is refused with one line that names the file (or variable) and the dotted field.

Issue 9, item 5: the configurations accepted silently before (duplicate keys, .nan/.inf, duplicate
nodes, bad memory sizes, URLs, storage roots, schedules, suites, modules, paths for plan names,
non-UTF-8 files), the ones refused well before, and more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError

CLUSTER, PLAN = "cluster.yaml", "plans/trades.yaml"


def data(change: Callable[[dict], object]) -> Callable[[str], str]:
    """A change of the parsed YAML (the file is written back as YAML)."""
    def edit(text: str) -> str:
        loaded = yaml.safe_load(text)
        change(loaded)
        return yaml.safe_dump(loaded)
    return edit


def node_a(**fields) -> Callable[[str], str]:
    return data(lambda d: d["nodes"]["node-a"].update(fields))


def section(name: str, **fields) -> Callable[[str], str]:
    return data(lambda d: d.setdefault(name, {}).update(fields))


def top(**fields) -> Callable[[str], str]:
    return data(lambda d: d.update(fields))


def append(line: str) -> Callable[[str], str]:
    return lambda text: text + line + "\n"


def aggregates(**fields) -> Callable[[str], str]:
    return data(lambda d: d["outputs"]["trade_aggregates"].update(fields))


def measure(**measures) -> Callable[[str], str]:
    """Measures added to (or replacing some of) the trades plan's aggregation."""
    return data(lambda d: d["outputs"]["trade_aggregates"]["measures"].update(measures))


STATS = {"kind": "aggregation", "key": ["symbol"], "measures": {"trades": {"count": "*"}}}
"""An aggregation without a ``table``: its table is named ``<plan>_<output>``."""


CASES = {
    # accepted silently before
    "duplicate top-level key": (CLUSTER, append("storage_root: /srv/other"), "line", "duplicate key 'storage_root'"),
    "duplicate node definition": (CLUSTER, lambda t: t.replace("  node-b:", "  node-a:"), "line",
                                  "duplicate key 'node-a'"),
    "duplicate plan key": (PLAN, append("watermark: 1 second"), "line", "duplicate key 'watermark'"),
    "nan count": (PLAN, lambda t: t.replace("max_missed: 3", "max_missed: .nan"), "heartbeat.max_missed",
                  "expected an integer"),
    "inf duration": (PLAN, lambda t: t.replace("watermark: 10 seconds", "watermark: .inf"), "watermark", "finite"),
    "inf snapshot interval": (PLAN, lambda t: t.replace("interval: 15 minutes", "interval: .inf"),
                              "snapshot.interval", "finite"),
    "node listed twice": (PLAN, top(nodes=["node-a", "node-a"]), "nodes", "must be unique: node-a"),
    "driver memory": (CLUSTER, node_a(driver_memory="lots"), "nodes.node-a.driver_memory", "Spark memory size"),
    "api url": (CLUSTER, section("airflow", api_url="not a url"), "airflow.api_url", "http(s):// URL"),
    "api url scheme": (CLUSTER, section("airflow", api_url="ftp://host/x"), "airflow.api_url", "http(s):// URL"),
    "storage root /": (CLUSTER, top(storage_root="/"), "storage_root", "cannot be the storage root"),
    "storage root empty": (CLUSTER, top(storage_root=" "), "storage_root", "cannot be the storage root"),
    "schedule": (PLAN, section("validation", schedule="every other tuesday"), "validation.schedule", "cron"),
    "maintenance schedule": (PLAN, section("maintenance", schedule="nightly-ish"), "maintenance.schedule", "cron"),
    "suite path": (PLAN, section("validation", suite="../../../../etc/passwd"), "validation.suite", "must match"),
    "snapshot suite path": (PLAN, section("snapshot", suite="/etc/passwd"), "snapshot.suite", "must match"),
    "missing suite": (PLAN, section("snapshot", suite="no_such_suite"), "snapshot.suite", "does not exist"),
    "module os": (PLAN, top(module="os"), "module", "tandem.plans"),
    "module outside plans": (PLAN, top(module="tandem.cli"), "module", "tandem.plans"),
    "not utf-8": (PLAN, None, "", "not UTF-8 text"),
    "conn id with a dash": (CLUSTER, node_a(airflow_conn_id="tandem-node-a"), "nodes.node-a.airflow_conn_id",
                            "cannot name the variable"),
    "conn id with a command": (CLUSTER, node_a(airflow_conn_id="x$(reboot)"), "nodes.node-a.airflow_conn_id",
                               "cannot name the variable"),
    # refused well before, still refused
    "spark master missing": (CLUSTER, data(lambda d: d["nodes"]["node-a"].pop("spark_master")),
                             "nodes.node-a.spark_master", "is required"),
    "unknown node field": (CLUSTER, node_a(typo=1), "nodes.node-a.typo", "unknown field"),
    "database url": (CLUSTER, section("database", url="mysql://u:pw@x/db"), "database.url", "postgresql://"),
    "no nodes": (CLUSTER, top(nodes={}), "nodes", "at least one"),
    "bad duration": (PLAN, top(watermark="soon"), "watermark", "duration"),
    "query in two groups": (PLAN, data(lambda d: d["groups"].update(more={"queries": ["aggregates"]})),
                            "groups.shard.queries[0]", "more than one group (in group more too"),
    "unknown node": (PLAN, top(nodes=["node-z"]), "nodes[0]", "unknown node"),
    "zero missed beats": (PLAN, section("heartbeat", max_missed=0), "heartbeat.max_missed", "positive"),
    "csv": (PLAN, data(lambda d: d["streams"]["trades"].update(format="csv")), "streams.trades.format", "jsonl"),
    "name not the file": (PLAN, top(name="other"), "name", "file name"),
    "boolean duration": (PLAN, top(trigger_interval=True), "trigger_interval", "expected"),
    # more
    "keep as text": (PLAN, section("snapshot", keep="3"), "snapshot.keep", "an integer"),
    "keep as fraction": (PLAN, section("snapshot", keep=2.5), "snapshot.keep", "an integer"),
    "launches as boolean": (PLAN, section("ha", max_launches=True), "ha.max_launches", "an integer"),
    "standby lukewarm": (PLAN, section("ha", standby="lukewarm"), "ha.standby", "one of hot, warm, cold"),
    "negative timeout": (PLAN, section("ha", stall_timeout="-5 s"), "ha.stall_timeout", "duration"),
    "vacuum retention as text": (PLAN, section("maintenance", vacuum_retention="soon"), "maintenance.vacuum_retention",
                                 "duration"),
    "compact as text": (PLAN, section("maintenance", compact="yes"), "maintenance.compact", "boolean"),
    "vacuum retention under a day": (PLAN, section("maintenance", vacuum_retention="12 hours"),
                                     "maintenance.vacuum_retention", "shorter than 1 day (the least Tandem keeps"),
    "vacuum retention under the snapshots' span": (
        PLAN, data(lambda d: (d["maintenance"].update(vacuum_retention="2 days"),
                              d["snapshot"].update(interval="1 day", keep=3))),
        "maintenance.vacuum_retention", "shorter than the 3 days the kept snapshots span (snapshot.keep 3"),
    "partials of a week": (PLAN, section("maintenance", retention={"partials": {"week": "1 day"}}),
                           "maintenance.retention.partials.week", "second"),
    "partials younger than the watermark": (PLAN, section("maintenance", retention={"partials": {"second": "5 s"}}),
                                            "maintenance.retention.partials.second", "longer than the plan's watermark"),
    "seconds kept longer than minutes": (PLAN, section("maintenance", retention={"partials": {
        "second": "3 days", "minute": "1 day"}}), "maintenance.retention.partials.second", "longer than minute ones"),
    "minutes dropped, seconds kept": (PLAN, section("maintenance", retention={"partials": {"minute": "1 day"}}),
                                      "maintenance.retention.partials.minute", "second partials longer than minute"),
    "progress shorter than a stall": (PLAN, section("maintenance", retention={"heartbeats": "10 s"}),
                                      "maintenance.retention.heartbeats", "ha.stall_timeout"),
    "events shorter than the launch window": (PLAN, section("maintenance", retention={"failover_events": "1 minute"}),
                                              "maintenance.retention.failover_events", "ha.launch_window"),
    "unknown retention": (PLAN, section("maintenance", retention={"quarantined": "1 day"}),
                          "maintenance.retention.quarantined", "unknown field"),
    "zero interval": (PLAN, section("heartbeat", interval="0 s"), "heartbeat.interval", "positive"),
    "negative files per trigger": (PLAN, data(lambda d: d["streams"]["trades"].update(max_files_per_trigger=-1)),
                                   "streams.trades.max_files_per_trigger", "positive integer"),
    "stream path": (PLAN, data(lambda d: d["streams"].update({"../x": d["streams"].pop("trades")})), "streams.../x",
                    "must match"),
    "max_length on a double": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["price"].update(max_length=5)),
                               "streams.trades.fields.price", "max_length apply to string fields only"),
    "max_length zero": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["symbol"].update(max_length=0)),
                        "streams.trades.fields.symbol.max_length", "positive integer"),
    "line size over 64 MiB": (PLAN, data(lambda d: d["streams"]["trades"].update(max_line_bytes=2 ** 40)),
                              "streams.trades.max_line_bytes", "67108864"),
    "partitions zero": (PLAN, data(lambda d: d["streams"]["trades"].update(partitions=0)), "streams.trades.partitions",
                        "positive integer"),
    "key not a field": (PLAN, data(lambda d: d["streams"]["trades"].update(key="isin")), "streams.trades",
                        "key 'isin' is not one of the fields"),
    "event time not epoch millis": (PLAN, data(lambda d: d["streams"]["trades"].update(event_time="price")),
                                    "streams.trades", "must be a field of type epoch_millis"),
    "default of another type": (PLAN, data(lambda d: d["streams"]["trades"]["fields"].update(
        venue={"type": "long", "default": "x"})), "streams.trades.fields.venue", "default 'x' is not an integer"),
    "default failing its bound": (PLAN, data(lambda d: d["streams"]["trades"]["fields"].update(
        venue={"type": "double", "greater_than": 0, "default": 0})), "streams.trades.fields.venue",
        "default 0 must be > 0 (greater_than)"),
    "required_since without a default": (PLAN, data(lambda d: d["streams"]["trades"]["fields"].update(
        venue={"type": "string", "required_since": "2026-12-01T00:00:00Z"})), "streams.trades.fields.venue",
        "required_since needs a default"),
    "required_since without a zone": (PLAN, data(lambda d: d["streams"]["trades"]["fields"].update(
        venue={"type": "string", "default": "x", "required_since": "2026-12-01T00:00:00"})),
        "streams.trades.fields.venue.required_since", "timezone"),
    "default of the key": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["symbol"].update(default="IBM")),
                           "streams.trades", "key 'symbol' takes no default"),
    "former key another field reads": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["price"].update(
        formerly="quantity")), "streams.trades", "fields 'price' and 'quantity' both read the key 'quantity'"),
    "unknown field type": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["price"].update(type="money")),
                           "streams.trades.fields.price.type", "string"),
    "bound on a string": (PLAN, data(lambda d: d["streams"]["trades"]["fields"]["symbol"].update(greater_than=1)),
                          "streams.trades.fields.symbol", "not numeric bounds"),
    "events without time": (PLAN, data(lambda d: d["outputs"].update(alerts={"kind": "events", "key": ["symbol"]})),
                            "outputs.alerts", "needs a time field"),
    "table without id": (PLAN, data(lambda d: d["outputs"].update(t={"kind": "table", "key": ["symbol"],
                                                                     "values": ["n"]})),
                         "outputs.t", "a table output needs the id of a contributing row"),
    "measure with two functions": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"]["measures"].update(
        price_sum={"sum": "price", "max": "price"})), "outputs.trade_aggregates.measures.price_sum", "exactly one of"),
    "max_values of an HLL distinct": (PLAN, measure(traders={"distinct": "symbol", "max_values": 10}),
                                      "outputs.trade_aggregates.measures.traders",
                                      "max_values: a setting of a distinct_exact measure, not of distinct"),
    "max_values of a sum": (PLAN, measure(price_sum={"sum": "price", "max_values": 10}),
                            "outputs.trade_aggregates.measures.price_sum",
                            "max_values: a setting of a distinct_exact measure, not of sum"),
    "max_values zero": (PLAN, measure(traders={"distinct_exact": "symbol", "max_values": 0}),
                        "outputs.trade_aggregates.measures.traders.max_values", "must be a positive integer, got 0"),
    "max_values past its cap": (PLAN, measure(traders={"distinct_exact": "symbol", "max_values": 1_000_001}),
                                "outputs.trade_aggregates.measures.traders.max_values",
                                "less than or equal to 1000000"),
    "max_values as text": (PLAN, measure(traders={"distinct_exact": "symbol", "max_values": "100"}),
                           "outputs.trade_aggregates.measures.traders.max_values", "integer"),
    "type of a distinct_exact": (PLAN, measure(traders={"distinct_exact": "symbol", "type": "long"}),
                                 "outputs.trade_aggregates.measures.traders",
                                 "type: a setting of a numeric measure, not of distinct_exact"),
    "distinct_exact and distinct at once": (PLAN, measure(traders={"distinct_exact": "symbol", "distinct": "symbol"}),
                                            "outputs.trade_aggregates.measures.traders", "exactly one of"),
    "distinct_exact of a bad field name": (PLAN, measure(traders={"distinct_exact": "Symbol"}),
                                           "outputs.trade_aggregates.measures.traders.distinct_exact", "must match"),
    "exact flag named like a measure": (PLAN, measure(traders={"distinct_exact": "symbol"},
                                                      traders_exact={"max": "price"}),
                                        "outputs.trade_aggregates", "traders_exact: each key, measure and ratio needs "
                                        "a column name of its own, none of the table's (plan, granularity, "
                                        "bucket_start, instance, epoch, batch_id, updated_at) (a distinct_exact "
                                        "measure m reads with m_exact)"),
    "exact flag named like a ratio": (PLAN, data(lambda d: (d["outputs"]["trade_aggregates"]["measures"].update(
        avg={"distinct_exact": "symbol"}), d["outputs"]["trade_aggregates"]["ratios"].update(
        avg_exact=["price_sum", "trade_count"]))), "outputs.trade_aggregates", "avg_exact: each key, measure"),
    "aggregation without a count": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"]["measures"].pop("trade_count")),
                                    "outputs.trade_aggregates", "needs a count measure"),
    "ratio of an unknown measure": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"]["ratios"].update(
        avg_price=["price_sum", "volume"])), "outputs.trade_aggregates", "'volume' is not a measure"),
    "facts without a time": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"].update(id=["symbol"])),
                             "outputs.trade_aggregates", "needs the time field"),
    "unknown granularity": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"].update(granularities=["week"])),
                            "outputs.trade_aggregates.granularities[0]", "expected one of second"),
    "granularity twice": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"].update(granularities=["hour", "hour"])),
                          "outputs.trade_aggregates", "each granularity once"),
    "granularities of events": (PLAN, data(lambda d: d["outputs"].update(alerts={
        "kind": "events", "key": ["symbol"], "time": "timestamp", "granularities": ["hour"]})),
        "outputs.alerts", "granularities: not a setting of an events output (granularities: aggregation)"),
    "values of events": (PLAN, data(lambda d: d["outputs"].update(alerts={
        "kind": "events", "key": ["symbol"], "time": "timestamp", "values": ["price"]})),
        "outputs.alerts", "values: not a setting of an events output (values: table, latest)"),
    "latest without values": (PLAN, data(lambda d: d["outputs"].update(last={
        "kind": "latest", "key": ["symbol"], "time": "timestamp"})),
        "outputs.last", "a latest output needs the values it keeps of the latest row"),
    "unknown output kind": (PLAN, data(lambda d: d["outputs"].update(x={"kind": "kafka"})), "outputs.x.kind",
                            "aggregation"),
    "description number": (PLAN, top(description=5), "description", "expected a string"),
    "groups as text": (PLAN, top(groups="shard-1"), "groups", "expected a mapping"),
    "no groups": (PLAN, top(groups={}), "groups", "at least one"),
    "section as list": (PLAN, top(snapshot=["15 minutes", 3]), "snapshot", "expected a mapping, got list"),
    "database as text": (CLUSTER, top(database="postgresql://x"), "database", "expected a mapping"),
    "unknown top-level field": (CLUSTER, top(replicas=3), "replicas", "unknown field"),
    "node name": (CLUSTER, data(lambda d: d["nodes"].update({"Node A": {"spark_master": "local"}})),
                  "nodes.Node A", "must match"),
    "node with nothing": (CLUSTER, lambda t: t.replace("  node-b:\n    spark_master: local[2]\n    airflow_conn_id: "
                                                       "tandem_node_b\n    driver_memory: 1g", "  node-b:"),
                          "nodes.node-b.spark_master", "is required"),
    "top level a list": (CLUSTER, lambda t: "- node-a\n- node-b\n", "(top level)", "expected a mapping, got a list"),
    "invalid yaml": (CLUSTER, lambda t: "nodes: [unclosed\n", "line", "invalid YAML"),
    # names that reach SQL (issue 24, §3): a trailing newline, reserved words, tables PostgreSQL cannot name
    "table with a trailing newline": (PLAN, aggregates(table="trade_aggregates\n"), "outputs.trade_aggregates.table",
                                      "must match"),
    "conn id with a trailing newline": (CLUSTER, node_a(airflow_conn_id="tandem_node_a\n"),
                                        "nodes.node-a.airflow_conn_id", "cannot name the variable"),
    "reserved table name": (PLAN, aggregates(table="order"), "outputs.trade_aggregates.table", "reserved word"),
    "reserved key": (PLAN, aggregates(key=["user"]), "outputs.trade_aggregates.key[0]", "reserved word"),
    "reserved measure": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"]["measures"].update(
        limit={"max": "price"})), "outputs.trade_aggregates.measures.limit", "reserved word"),
    "reserved field": (PLAN, data(lambda d: d["streams"]["trades"]["fields"].update(select={"type": "string"})),
                       "streams.trades.fields.select", "reserved word"),
    "reserved output": (PLAN, data(lambda d: d["outputs"].update(table={"kind": "quarantine"})), "outputs.table",
                        "reserved word"),
    "reserved plan name": (PLAN, top(name="group"), "name", "reserved word"),
    "default table too long": (PLAN, data(lambda d: d["outputs"].update({"stats_" + "x" * 56: STATS})),
                               f"outputs.stats_{'x' * 56}.table", "the default table name 'trades_stats_xxx"),
    "default table with a dash": (PLAN, data(lambda d: d["outputs"].update({"trade-stats": STATS})),
                                  "outputs.trade-stats.table", "the default table name 'trades_trade-stats' must match"),
    "key named like a table column": (PLAN, aggregates(key=["instance"]), "outputs.trade_aggregates",
                                      "instance: each key, measure and ratio needs a column name of its own"),
    "measure named like a key": (PLAN, data(lambda d: d["outputs"]["trade_aggregates"]["measures"].update(
        symbol={"max": "price"})), "outputs.trade_aggregates", "symbol: each key, measure and ratio"),
}


@pytest.mark.parametrize(("file", "change", "field", "fragment"), CASES.values(), ids=CASES.keys())
def test_a_broken_configuration_is_one_line_naming_file_and_field(conf: Path, file: str, change, field: str,
                                                                 fragment: str) -> None:
    path = conf / file
    if change is None:
        path.write_bytes(path.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    else:
        path.write_text(change(path.read_text()))
    with pytest.raises(ConfigError) as caught:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    error, text = caught.value, str(caught.value)
    assert "\n" not in text
    assert error.path == str(path.resolve())
    assert error.field.startswith(field) if field == "line" else error.field == field, text
    assert text.startswith(f"{path.resolve()}: ") and fragment in text, text
    assert "pw@" not in text  # a URL in a message is redacted


@pytest.mark.parametrize("name", ["../evil/trades.yaml", "/etc/passwd", "trades.yaml", "Trades", "a" * 64, "",
                                  "trades\n"])
def test_plan_names_are_names_never_paths(conf: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="is not a plan name"):
        load_plan(name, load_cluster(conf / "cluster.yaml"))


@pytest.mark.parametrize(("variable", "value", "fragment"), [
    ("TANDEM_STORAGE_ROOT", "/", "cannot be the storage root"),
    ("TANDEM_AIRFLOW_URL", "localhost:8080", "http(s):// URL"),
    ("TANDEM_DATABASE_URL", "mysql://u:pw@db/x", "postgresql://"),
])
def test_a_bad_environment_override_names_the_variable(conf: Path, monkeypatch: pytest.MonkeyPatch, variable: str,
                                                       value: str, fragment: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_cluster(conf / "cluster.yaml")
    assert str(caught.value).startswith(f"{variable} (environment): ") and fragment in str(caught.value)
    assert "pw@" not in str(caught.value) and "cluster.yaml" not in str(caught.value)


def run_cli(conf: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_CONF_DIR": str(conf)}
    return subprocess.run([sys.executable, "-m", "tandem.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=60)


def test_config_check_says_what_it_found_and_exits_2_on_a_broken_plan(conf: Path) -> None:
    good = run_cli(conf, "config", "check")
    assert good.returncode == 0, good.stderr
    assert "plan trades, instances shard-1, shard-2, streams trades (2 partitions)" in good.stdout
    assert "plan temperatures, instances group-1-1, group-2-1, group-2-2" in good.stdout
    assert "outputs delivered_orders (table), overdue_orders (events), last_orders (latest), order_stats (aggregation)" in good.stdout
    assert "4 of 4 plan file(s) valid" in good.stdout
    plan = conf / "plans" / "trades.yaml"
    lines = len(plan.read_text().splitlines())
    plan.write_text(plan.read_text() + "keep: 1\nkeep: 2\n")
    bad = run_cli(conf, "config", "check")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"error: {plan.resolve()}: line {lines + 2}: duplicate key 'keep' (first at line {lines + 1}; "
        "YAML would keep the later one)"]


def test_config_schema_describes_both_files(conf: Path) -> None:
    done = run_cli(conf, "config", "schema")
    assert done.returncode == 0
    schemas = json.loads(done.stdout)
    assert set(schemas) == {"cluster.yaml", "plans/<name>.yaml"}
    plan = schemas["plans/<name>.yaml"]
    assert plan["additionalProperties"] is False and {"name", "streams", "groups", "outputs", "nodes", "ha", "snapshot"} <= set(plan["properties"])
    assert set(plan["required"]) == {"name", "streams", "groups", "outputs", "nodes"}


def test_the_schema_accepts_the_shipped_files_and_refuses_broken_ones(conf: Path) -> None:
    """What editors would check with `tandem config schema` agrees with what Tandem loads."""
    import jsonschema

    from tandem.config import json_schemas

    schemas = json_schemas()
    cluster = yaml.safe_load((conf / "cluster.yaml").read_text())
    plan = yaml.safe_load((conf / "plans" / "trades.yaml").read_text())
    jsonschema.validate(cluster, schemas["cluster.yaml"])
    jsonschema.validate(plan, schemas["plans/<name>.yaml"])
    for broken, schema in (({**cluster, "replicas": 3}, "cluster.yaml"), ({**plan, "groups": "shard-1"}, "plans/<name>.yaml"),
                           ({**plan, "ha": {"standby": "lukewarm"}}, "plans/<name>.yaml")):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schemas[schema])


def test_every_problem_of_a_file_is_reported_each_naming_its_field(conf: Path) -> None:
    """Issue 47 §6: all of pydantic's problems at once; then, in a file whose fields are each valid, every refusal
    of the checks between them; each one line naming the file and the field."""
    plan = conf / "plans" / "trades.yaml"
    original = plan.read_text()
    plan.write_text(data(lambda d: (d.update(watermark="soon", colour="red"), d["heartbeat"].update(max_missed=0),
                                    d["streams"]["trades"]["fields"]["price"].update(greater_than="x")))(original))
    with pytest.raises(ConfigError) as caught:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    problems = {p.field: p.problem for p in caught.value.problems}
    assert set(problems) == {"watermark", "colour", "heartbeat.max_missed", "streams.trades.fields.price.greater_than"}
    assert problems["streams.trades.fields.price.greater_than"] == "expected a number, got 'x'"  # int | float: one line
    assert str(caught.value).splitlines() == [f"{plan.resolve()}: {p.field}: {p.problem}"
                                              for p in caught.value.problems]

    plan.write_text(data(lambda d: (d.update(nodes=["node-a", "node-y", "node-z"]),
                                    d.setdefault("validation", {}).update(suite="nowhere")))(original))
    with pytest.raises(ConfigError) as caught:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    assert [p.field for p in caught.value.problems] == ["nodes[1]", "nodes[2]", "validation.suite"]
    assert all(p.path == str(plan.resolve()) for p in caught.value.problems)


def test_config_check_prints_every_problem_and_exits_2(conf: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from tandem.cli import main

    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    plan = conf / "plans" / "pizza_shop.yaml"
    plan.write_text(data(lambda d: d.update(nodes=["node-y", "node-z"]))(plan.read_text()))
    assert main(["config", "check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"error: {plan.resolve()}: nodes[{i}]: unknown node 'node-{n}' (cluster.yaml defines node-a, "
                     "node-b)" for i, n in ((0, "y"), (1, "z"))]


def test_config_schema_writes_to_a_path(conf: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    from tandem.cli import main
    from tandem.config import json_schemas

    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    both, plan_only = tmp_path / "schemas.json", tmp_path / "plan.schema.json"
    assert main(["config", "schema", str(both)]) == 0
    assert main(["config", "schema", "plans/<name>.yaml", str(plan_only)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote the JSON Schema of cluster.yaml, plans/<name>.yaml to {both}",
        f"wrote the JSON Schema of plans/<name>.yaml to {plan_only}"]
    schemas = json_schemas()
    assert json.loads(both.read_text()) == schemas
    assert json.loads(plan_only.read_text()) == schemas["plans/<name>.yaml"]
    assert main(["config", "schema", "plans/<name>.yaml", str(tmp_path / "plan.yaml")]) == 2  # JSON as YAML
    assert main(["config", "schema", "nonsense.yaml", str(tmp_path / "x.json")]) == 2
    assert main(["config", "check", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "plan.yaml").exists() and not (tmp_path / "x.json").exists()
