"""``tandem exporter``'s readings on real PostgreSQL and a real Delta quarantine table (no Spark): a scrape says what
the test wrote through Tandem's own store functions (leases taken, handed over, batches published, job runs, relayed
events, quarantined lines), counted independently here; counters do not go down when maintenance trims the rows
they count; and the HTTP endpoint serves it only with the token."""

from __future__ import annotations


from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tandem.config import load_cluster
from tandem.lake.tables import append_once
from tandem.layout import delta_table_dir
from tandem.monitoring.exporter import PlaneCollector, serve
from tandem.outputs.quarantine import QUARANTINE_SCHEMA
from tandem.store import Database, migrate
from tandem.store.job_runs import recorded_run
from tandem.store.leases import try_acquire
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey
from tandem.store.supervision import hand_over

pytestmark = pytest.mark.integration
UTC = timezone.utc


def scrape(collector: PlaneCollector) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one collect, through the exposition format and back."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def publish(db: Database, node: str, batch: int, rows: int, epoch: int, output: str = "trade_aggregates") -> None:
    db.run(lambda cursor: record_published(cursor, InstanceKey("trades", "shard-1", node), output, batch, epoch, rows,
                                           None, None))


def test_a_scrape_counts_what_the_plane_recorded_and_counters_survive_a_trim(project: Path, database_url: str) -> None:
    cluster = load_cluster()
    with Database(database_url) as db:
        migrate(db)
        # node-a takes the free lease (a start, no failover), node-b takes it once expired (a takeover),
        # then the operator hands it back (a handover)
        first = try_acquire(db, "trades", "shard-1", "node-a", ttl_s=0.2)
        publish(db, "node-a", 0, 40, first)
        publish(db, "node-a", 1, 2, first)
        db.run(lambda cursor: cursor.execute("SELECT pg_sleep(0.3)"))
        second = try_acquire(db, "trades", "shard-1", "node-b", ttl_s=30.0)
        publish(db, "node-b", 2, 5, second)
        third = hand_over(db, "trades", "shard-1", "node-b", second, "node-a", "test: failover_now")
        assert (first, second, third) == (1, 2, 3)
        with recorded_run(db, "trades", "delta_upkeep"):
            pass
        with pytest.raises(RuntimeError), recorded_run(db, "trades", "delta_upkeep"):
            raise RuntimeError("disk full")
        # the hot_rooms relay stored 1 of its 3 events in the stream
        db.run(lambda cursor: cursor.execute(
            """INSERT INTO output_events (plan, output, event_id, instance, event_time, payload, node, epoch, batch_id)
               SELECT 'hot_rooms', 'hot_rooms', 'e' || n, 'rooms-1', now(), '{}'::jsonb, 'node-a', 1, 0
               FROM generate_series(1, 3) n;
               INSERT INTO output_streams (plan, output, stream, stream_seq, xid, event_id)
               SELECT plan, output, 'tandem_hot_rooms', 7, xid::text::bigint, event_id FROM output_events
               WHERE event_id = 'e1'"""))
    quarantine = delta_table_dir(cluster, "trades", "quarantine")
    reasons = ["missing field 'price'", "missing field 'symbol'; field 'price' is not a number: \"x\"",
               "field 'price' must be > 0 (got -1)", "malformed JSON: not a JSON object"]
    append_once(quarantine, pa.Table.from_pylist([
        {"raw": "{}", "source_file": f"f{i}", "reason": reason, "plan": "trades",
         "instance": "shard-1" if i < 3 else "shard-2", "node": "node-a", "batch_id": 0,
         "quarantined_at": datetime.now(UTC), "plan_version": "v"} for i, reason in enumerate(reasons)],
        schema=QUARANTINE_SCHEMA), "test", 0)

    collector = PlaneCollector()
    samples = scrape(collector)
    at = {"plan": "trades", "plan_instance": "shard-1"}
    assert value(samples, "tandem_up") == 1
    assert value(samples, "tandem_failovers_total", **at, cause="takeover") == 1
    assert value(samples, "tandem_failovers_total", **at, cause="handover") == 1
    assert value(samples, "tandem_failovers_total", **at, cause="restore") == 0
    assert value(samples, "tandem_published_rows_total", **at, output="trade_aggregates") == 47
    assert value(samples, "tandem_instance_active", **at) == 1
    assert value(samples, "tandem_lease_epoch", **at) == 3
    assert value(samples, "tandem_lease_state", **at, state="held") == 1
    assert value(samples, "tandem_instance_active", plan="trades", plan_instance="shard-2") == 0
    assert value(samples, "tandem_lease_state", plan="trades", plan_instance="shard-2", state="free") == 1
    assert value(samples, "tandem_job_runs_total", plan="trades", job="delta_upkeep", result="SUCCESS") == 1
    assert value(samples, "tandem_job_runs_total", plan="trades", job="delta_upkeep", result="FAILURE") == 1
    assert value(samples, "tandem_job_last_success", plan="trades", job="delta_upkeep") == 0
    assert value(samples, "tandem_relay_pending_events", plan="hot_rooms", output="hot_rooms") == 2
    assert value(samples, "tandem_relay_stream_sequence", plan="hot_rooms", output="hot_rooms") == 7
    assert value(samples, "tandem_quarantine_rows", **at, reason="missing_field") == 2
    assert value(samples, "tandem_quarantine_rows", **at, reason="check_failed") == 1
    assert value(samples, "tandem_quarantine_rows", plan="trades", plan_instance="shard-2",
                 reason="malformed_json") == 1
    assert value(samples, "tandem_quarantine_rows", **at, reason="wrong_type") == 0

    with Database(database_url) as db:
        # maintenance trims the oldest published batch and role change; new ones come
        db.run(lambda cursor: cursor.execute("DELETE FROM publish_log WHERE batch_id = 0; "
                                             "DELETE FROM failover_events WHERE epoch = 2"))
        publish(db, "node-a", 3, 8, third)
    samples = scrape(collector)
    assert value(samples, "tandem_published_rows_total", **at, output="trade_aggregates") == 55
    assert value(samples, "tandem_failovers_total", **at, cause="takeover") == 1


def test_the_endpoint_wants_its_token_and_a_database_it_cannot_reach_is_tandem_up_0(
        project: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Database(database_url) as db:
        migrate(db)
    server = serve("127.0.0.1", 0, "t0ken")
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        assert requests.get(f"{url}/metrics", timeout=30).status_code == 401
        assert requests.get(f"{url}/healthz", timeout=30).text == "ok\n"
        answer = requests.get(f"{url}/metrics", headers={"Authorization": "Bearer t0ken"}, timeout=30)
        assert answer.status_code == 200 and "tandem_up 1.0" in answer.text
        monkeypatch.setenv("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1")
        answer = requests.get(f"{url}/metrics", headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert answer.status_code == 200 and "tandem_up 0.0" in answer.text
        assert "t0ken" not in answer.text and "tandem_instance_active{" not in answer.text
    finally:
        server.shutdown()
        server.server_close()
