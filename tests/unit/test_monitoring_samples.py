"""The exporter's pure parts: the samples of a plan's status, the counters over trimmed tables, reason classes,
the bearer-token guard and the exposition (hand-written readings; no database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tandem.config import load_cluster, load_plan
from tandem.errors import TandemError
from tandem.monitoring import exporter
from tandem.monitoring.catalog import BY_NAME, METRICS
from tandem.monitoring.reasons import REASON_CLASSES, reason_class
from tandem.monitoring.samples import Samples, add_failovers, add_jobs, add_plan, failover_budget_s
from tandem.monitoring.tally import Tally
from tandem.presenter.models import InstanceStatus, LeaseState, NodeState, PlanStatus

UTC = timezone.utc
NOW = datetime(2026, 12, 2, 12, tzinfo=UTC)


def _node(node: str, role: str | None, health: str, **fields) -> NodeState:
    values = dict(epoch=4, status="RUNNING", health=health, evidence="", drained=False, host="h", pid=1,
                  beat_age_s=0.5, last_batch_id=9, last_batch_age_s=1.5, lag_s=3.0, waiting_input_s=None,
                  version="v2")
    values.update(fields)
    return NodeState(node=node, role=role, **values)


def _status(lease: LeaseState, nodes: list[NodeState]) -> PlanStatus:
    return PlanStatus(plan="trades", observed_at=NOW, version="v2", instances=[
        InstanceStatus(instance="shard-1", group="shard", standby="hot", lease=lease, nodes=nodes, due=[],
                       last_failover=None, last_good_snapshot=None)])


def _lease(state: str, vacant_for_s: float | None = None) -> LeaseState:
    return LeaseState(state=state, holder="node-a", epoch=4, valid=state == "held", expires_in_s=-vacant_for_s
                      if vacant_for_s else 2.5, acquired_at=NOW - timedelta(minutes=3),
                      vacant_since=None if vacant_for_s is None else NOW - timedelta(seconds=vacant_for_s))


@pytest.fixture
def trades(conf: Path):
    return load_plan("trades", load_cluster(conf / "cluster.yaml"))


def test_an_expired_lease_is_a_vacancy_a_clean_stop_is_not(trades) -> None:
    expired = Samples()
    add_plan(expired, trades, _status(_lease("expired", 42.0), [_node("node-a", None, "DEAD"),
                                                                 _node("node-b", "PASSIVE", "HEALTHY")]))
    at = ("trades", "shard-1")
    assert expired.values["tandem_instance_active"][at] == 0
    assert expired.values["tandem_instance_vacant_seconds"][at] == 42.0
    assert expired.values["tandem_lease_state"][at + ("expired",)] == 1
    assert sum(expired.values["tandem_lease_state"].values()) == 1
    roles = expired.values["tandem_node_role"]
    assert roles[at + ("node-a", "NONE")] == 1 and roles[at + ("node-b", "PASSIVE")] == 1
    assert sum(roles.values()) == 2
    assert expired.values["tandem_node_health"][at + ("node-a", "DEAD")] == 1
    assert expired.values["tandem_node_event_time_lag_seconds"][at + ("node-a",)] == 3.0
    assert at + ("node-a",) not in expired.values["tandem_node_input_waiting_seconds"]  # unknown: no sample

    stopped = Samples()
    add_plan(stopped, trades, _status(_lease("stopped", 600.0), [_node("node-a", None, "STOPPED")]))
    assert stopped.values["tandem_instance_vacant_seconds"][at] == 0
    held = Samples()
    add_plan(held, trades, _status(_lease("held"), [_node("node-a", "ACTIVE", "HEALTHY")]))
    assert held.values["tandem_instance_active"][at] == 1
    assert held.values["tandem_lease_expires_in_seconds"][at] == 2.5
    assert held.values["tandem_node_version_info"][at + ("node-a", "v2")] == 1


def test_the_failover_budget_grows_with_the_standby_s_start(trades) -> None:
    ttl = trades.heartbeat.timeout_s
    assert failover_budget_s(trades) == 2 * ttl + trades.trigger_interval_s
    cold = trades.__class__(**{**trades.__dict__, "ha": trades.ha.model_copy(update={"standby": "cold"})})
    assert failover_budget_s(cold) == 2 * ttl + trades.trigger_interval_s + trades.ha.launch_timeout_s


def test_a_label_set_other_than_the_catalog_s_is_refused() -> None:
    with pytest.raises(ValueError, match="plan_instance"):
        Samples().add("tandem_instance_active", 1, plan="trades", instance="shard-1")


def test_failover_counters_start_at_zero_for_every_cause() -> None:
    samples = Samples()
    add_failovers(samples, {("trades", "shard-1", "takeover"): 2.0}, [("trades", "shard-1"), ("trades", "shard-2")])
    values = samples.values["tandem_failovers_total"]
    assert values[("trades", "shard-1", "takeover")] == 2 and values[("trades", "shard-2", "takeover")] == 0
    assert len(values) == 6


def test_job_runs_count_both_results_and_the_last_one() -> None:
    samples = Samples()
    add_jobs(samples, [{"plan": "trades", "job": "delta_upkeep", "result": "FAILURE", "runs": 1}],
             [{"plan": "trades", "job": "delta_upkeep", "result": "FAILURE", "duration_s": 2.0, "age_s": 30.0}])
    assert samples.values["tandem_job_runs_total"] == {("trades", "delta_upkeep", "SUCCESS"): 0,
                                                       ("trades", "delta_upkeep", "FAILURE"): 1}
    assert samples.values["tandem_job_last_success"] == {("trades", "delta_upkeep"): 0}


class TableRows:
    """A table that grows and is trimmed, read as the exporter reads it."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.now = NOW

    def read(self, since: datetime | None):
        totals = {}
        for row in self.rows:
            totals[row["output"]] = totals.get(row["output"], 0) + row["value"]
        start = since if since is not None else self.now - timedelta(minutes=10)
        recent = [row for row in self.rows if row["at"] >= start]
        return ([{"output": o, "value": v} for o, v in totals.items()] if since is None else []), recent, start


def test_a_tally_never_goes_down_when_old_rows_are_trimmed_and_counts_late_commits_once() -> None:
    table = TableRows()
    table.rows += [{"id": i, "output": "out", "value": 10, "at": NOW - timedelta(hours=2) + timedelta(seconds=i)}
                   for i in range(5)]
    # the newest row is a few minutes old: within a later reading's window back from it, not the first one's
    table.rows += [{"id": 9, "output": "out", "value": 3, "at": NOW - timedelta(minutes=15)}]
    tally = Tally(table.read, lambda row: (row["output"],), lambda row: row["id"])
    assert tally.update() == {("out",): 53.0}
    assert tally.update() == {("out",): 53.0}  # nothing new: nothing counted twice
    table.rows += [{"id": 5, "output": "out", "value": 7, "at": NOW}]
    assert tally.update() == {("out",): 60.0}
    table.rows = [row for row in table.rows if row["at"] >= NOW - timedelta(hours=1)]  # maintenance trims
    table.rows += [{"id": 6, "output": "out", "value": 1, "at": NOW + timedelta(seconds=5)},
                   # a transaction that began before id 6's and committed after it: its time is earlier
                   {"id": 7, "output": "out", "value": 2, "at": NOW + timedelta(seconds=1)}]
    assert tally.update() == {("out",): 63.0}
    assert tally.update() == {("out",): 63.0}  # read again: nothing counted twice


@pytest.mark.parametrize(("reason", "expected"), [
    ("line of 2000000 bytes is over the stream's max_line_bytes (1048576); its first 1000 characters are kept",
     "too_long"),
    ("line is not valid UTF-8 (invalid bytes are kept as U+FFFD)", "encoding"),
    ("malformed JSON: not a JSON object", "malformed_json"),
    ("duplicate key 'price'", "duplicate_key"),
    ("missing field 'price'; field 'quantity' is not an integer: \"x\"", "missing_field"),
    ("field 'success' is not a boolean: \"yes\"", "wrong_type"),
    ("field 'ts' is an ISO-8601 time without a zone (write Z or an offset such as +01:00): \"2026-01-01T00:00\"",
     "wrong_type"),
    ("field 'n' is outside the 64-bit integer range: 1e30", "wrong_type"),
    ("field 'price' must be > 0 (got -1.5)", "check_failed"),
    ("output orders: the store refused the row: value too long", "output_refused"),
    ("something new", "other"),
    (None, "other"),
])
def test_a_reason_s_class_is_its_first_problem_s(reason: str | None, expected: str) -> None:
    assert reason_class(reason) == expected in REASON_CLASSES


def test_the_exposition_parses_back_with_the_catalog_s_names_and_types() -> None:
    samples = Samples()
    samples.add("tandem_up", 1)
    add_failovers(samples, {}, [("trades", "shard-1")])
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):
            return exporter.families(samples)

    registry.register(Fixed())
    parsed = {family.name: family for family in text_string_to_metric_families(generate_latest(registry).decode())}
    assert {f"{m.name.removesuffix('_total')}" for m in METRICS} == set(parsed)
    assert parsed["tandem_failovers"].type == "counter"
    assert {s.name for s in parsed["tandem_failovers"].samples} == {"tandem_failovers_total"}
    assert all(name.startswith("tandem_") and BY_NAME[name].help for name in BY_NAME)


def test_the_token_guard_refuses_a_scrape_without_the_token_but_not_a_liveness_probe() -> None:
    calls = []
    app = exporter.guarded(lambda environ, start: calls.append(environ) or [b"metrics"], "s3cret")
    statuses = []

    def status(code: str, headers) -> None:
        statuses.append(code)

    assert app({"PATH_INFO": "/metrics"}, status) == [b"a bearer token is required\n"]
    assert app({"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer wrong"}, status)[0].startswith(b"a bearer")
    assert app({"PATH_INFO": "/healthz"}, status) == [b"ok\n"]
    assert app({"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer s3cret"}, status) == [b"metrics"]
    assert statuses == ["401 Unauthorized", "401 Unauthorized", "200 OK"] and len(calls) == 1


def test_a_token_comes_from_a_file_or_the_environment_and_an_empty_one_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(exporter.TOKEN_VARIABLE, raising=False)
    assert exporter.token_from(None) is None
    monkeypatch.setenv(exporter.TOKEN_VARIABLE, "from-env")
    assert exporter.token_from(None) == "from-env"
    (tmp_path / "token").write_text("from-file\n")
    assert exporter.token_from(str(tmp_path / "token")) == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TandemError, match="empty"):
        exporter.token_from(str(tmp_path / "empty"))
    monkeypatch.setenv(exporter.TOKEN_VARIABLE, " ")
    with pytest.raises(TandemError, match=exporter.TOKEN_VARIABLE):
        exporter.token_from(None)


def _reading(started: float, finished: float) -> exporter.Reading:
    return exporter.Reading(Samples(), started, finished)


def test_a_scrape_shares_a_reading_under_way_or_begun_within_the_fresh_window() -> None:
    assert not exporter.reusable(None, 10.0, 0.5)
    assert exporter.reusable(_reading(9.0, 10.2), 10.0, 0.0)  # under way when the scrape arrived: shared
    assert exporter.reusable(_reading(10.1, 10.3), 10.0, 0.0)  # begun after it arrived
    assert exporter.reusable(_reading(9.6, 9.7), 10.0, 0.5)  # begun 0.4 s before, within 0.5 s
    assert exporter.reusable(_reading(9.5, 9.7), 10.0, 0.5)
    assert not exporter.reusable(_reading(9.4, 9.7), 10.0, 0.5)  # begun 0.6 s before
    assert not exporter.reusable(_reading(9.9, 9.95), 10.0, 0.0)  # no window: only a reading under way


def test_the_exporter_refuses_to_start_open_beyond_loopback_or_with_settings_out_of_range() -> None:
    def refusal(host: str = "127.0.0.1", token: str | None = None, timeout: float = 5.0, connections: int = 32,
                fresh: float = 0.5, addresses: tuple[str, ...] | None = None) -> str | None:
        found = (host,) if addresses is None else addresses
        return exporter.start_refusal(host, found, token, timeout, connections, fresh)

    assert refusal("127.0.0.1") is None and refusal("127.8.9.1") is None and refusal("::1") is None
    assert refusal("localhost", addresses=("127.0.0.1", "::1")) is None
    for open_host, found in (("0.0.0.0", None), ("::", None), ("", ()), ("192.0.2.7", None),
                             ("scrape.internal", ("127.0.0.1", "192.0.2.7")), ("nowhere.invalid", ())):
        assert refusal(open_host, "t0ken", addresses=found) is None
        assert refusal(open_host, addresses=found) == (
            f"--host {open_host or '(every interface)'}: without a bearer token the exporter listens on loopback only "
            "(127.0.0.1, ::1): set --token-file or TANDEM_EXPORTER_TOKEN, or listen on 127.0.0.1")
    assert refusal(timeout=0) == "--read-timeout must be a positive number of seconds, got 0"
    assert refusal(timeout=float("nan")) == "--read-timeout must be a positive number of seconds, got nan"
    assert refusal(connections=0) == "--max-connections must be at least 1, got 0"
    assert refusal(fresh=-1) == "--fresh-for must be 0 seconds or more, got -1"
    assert refusal(fresh=0) is None


def test_a_host_stands_for_its_addresses() -> None:
    assert exporter.addresses_of("127.0.0.1") == {"127.0.0.1"} and exporter.addresses_of("") == set()
    assert exporter.addresses_of("0:0::1") == {"::1"}
    assert exporter.addresses_of("localhost") and exporter.addresses_of("localhost") <= {"127.0.0.1", "::1"}
