"""``tandem exporter``'s readings on real PostgreSQL and a real Delta quarantine table (no Spark): a scrape says what
the test wrote through Tandem's own store functions (leases taken, handed over, batches published, job runs, relayed
events, quarantined lines, in a quarantine output of any name, whose spike ``promtool`` then alerts on), counted
independently here; counters do not go down when maintenance trims the rows they count; and the HTTP endpoint serves
it only with the token.

Serving, on a real listening exporter and raw sockets: connections that send half a request hold a bounded number of
threads and are closed, concurrent scrapes cost one reading (PostgreSQL's own scan counters say so), the session
cannot write (nor can a role with only the documented grants), and it listens beyond loopback only with a token."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.errors
import pyarrow as pa
import pytest
import requests
import yaml
from _ha import wait_for
from prometheus_client.parser import text_string_to_metric_families

from tandem.config import load_cluster
from tandem.lake.tables import append_once
from tandem.layout import delta_table_dir
from tandem.monitoring import exporter
from tandem.monitoring.exporter import PlaneCollector, serve
from tandem.outputs.quarantine import QUARANTINE_SCHEMA
from tandem.presenter.cache import VersionedCache
from tandem.store import Database, migrate
from tandem.store.job_runs import recorded_run
from tandem.store.leases import try_acquire
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey
from tandem.store.supervision import hand_over

pytestmark = pytest.mark.integration
RULES = Path(__file__).resolve().parents[2] / "conf" / "prometheus" / "tandem-rules.yml"
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
               "field 'price' must be > 0 (got -1)", "invalid JSON: Expecting value at line 1 column 1"]
    append_once(quarantine, pa.Table.from_pylist([
        {"raw": "{}", "source_file": f"f{i}", "reason": reason, "plan": "trades",
         "instance": "shard-1" if i < 3 else "shard-2", "node": "node-a", "batch_id": 0,
         "quarantined_at": datetime.now(UTC), "plan_version": "v"} for i, reason in enumerate(reasons)],
        schema=QUARANTINE_SCHEMA), "test", 0)

    collector = PlaneCollector(fresh_s=0.0)  # each scrape reads
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
    assert value(samples, "tandem_quarantine_rows", **at, output="quarantine", reason="missing_field") == 2
    assert value(samples, "tandem_quarantine_rows", **at, output="quarantine", reason="check_failed") == 1
    assert value(samples, "tandem_quarantine_rows", plan="trades", plan_instance="shard-2", output="quarantine",
                 reason="malformed_json") == 1
    assert value(samples, "tandem_quarantine_rows", **at, output="quarantine", reason="wrong_type") == 0

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
    server = serve("127.0.0.1", 0, "t0ken", fresh_s=0.0)
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


def _spike_rule_test(before: str, after: str, folder: Path) -> subprocess.CompletedProcess:
    """``promtool test rules`` of the shipped rules on the exporter's own quarantine series: each series of ``before``
    (an exposition) for an hour, then its value in ``after``; ``TandemQuarantineSpike`` is expected on trades/shard-1,
    with the plan's quarantine output named in the command it suggests, and on nothing else."""
    def series(text: str) -> dict[str, float]:
        return {"tandem_quarantine_rows{" + ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}":
                s.value for family in text_string_to_metric_families(text) if family.name == "tandem_quarantine_rows"
                for s in family.samples}

    old, new = series(before), series(after)
    assert old.keys() == new.keys()
    test = {"rule_files": [str(RULES)], "evaluation_interval": "15s", "tests": [{
        "interval": "10m",
        "input_series": [{"series": name, "values": " ".join([f"{old[name]:g}"] * 8 + [f"{new[name]:g}"])}
                         for name in sorted(new)],
        "alert_rule_test": [
            {"eval_time": "70m", "alertname": "TandemQuarantineSpike", "exp_alerts": []},
            {"eval_time": "80m", "alertname": "TandemQuarantineSpike", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "plan": "trades", "plan_instance": "shard-1",
                               "output": "rejects"},
                "exp_annotations": {
                    "summary": "trades/shard-1: 150 lines quarantined in 10 minutes",
                    "description": "More than 100 input lines went to the quarantine in 10 minutes, over five times "
                                   "the rate of the hour before: a producer sends something the plan refuses "
                                   "(`tandem query trades rejects`)."}}]}]}]}
    (folder / "spike_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(["promtool", "test", "rules", str(folder / "spike_test.yml")], capture_output=True,
                          text=True, timeout=120)


def test_a_quarantine_output_of_another_name_is_counted_and_its_spike_fires_the_alert(
        project: Path, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporter, "QUARANTINE_COUNTS", VersionedCache(ttl_s=0.0))  # the second scrape looks again
    plan_file = project / "conf" / "plans" / "trades.yaml"
    shipped = plan_file.read_text()
    plan_file.write_text(shipped.replace("  quarantine:\n    kind: quarantine\n", "  rejects:\n    kind: quarantine\n"))
    assert plan_file.read_text() != shipped
    with Database(database_url) as db:
        migrate(db)
    server = serve("127.0.0.1", 0, "t0ken", fresh_s=0.0)
    url, token = f"http://127.0.0.1:{server.server_port}/metrics", {"Authorization": "Bearer t0ken"}
    try:
        before = requests.get(url, headers=token, timeout=60).text
        append_once(delta_table_dir(load_cluster(), "trades", "rejects"), pa.Table.from_pylist([
            {"raw": f"line {i}", "source_file": f"f{i}", "reason": "missing field 'price'", "plan": "trades",
             "instance": "shard-1", "node": "node-a", "batch_id": 0, "quarantined_at": datetime.now(UTC),
             "plan_version": "v"} for i in range(150)], schema=QUARANTINE_SCHEMA), "test", 0)
        after = requests.get(url, headers=token, timeout=60).text
    finally:
        server.shutdown()
        server.server_close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(after) for s in family.samples}
    at = {"plan": "trades", "plan_instance": "shard-1", "output": "rejects"}
    assert value(samples, "tandem_quarantine_rows", **at, reason="missing_field") == 150
    assert value(samples, "tandem_quarantine_rows", **at, reason="wrong_type") == 0
    tested = _spike_rule_test(before, after, tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# ------------------------------------------------------------------------------------------------
# Serving: connections that send nothing, concurrent scrapes, a read-only session, where it may listen


def _handler_threads() -> int:
    """The exporter's connection threads in this process (socketserver names them after their target); the
    process's other threads (a Spark session's, the suite's own samplers) come and go on their own."""
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def _threads_while(action: Callable[[], None]) -> int:
    """The most connection threads this process had while ``action`` ran (sampled every 5 ms)."""
    peak, done = [_handler_threads()], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(_handler_threads())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join()
    return max(peak)


def test_half_open_connections_hold_no_thread_beyond_the_cap_and_are_dropped_while_a_scrape_answers(
        project: Path, database_url: str) -> None:
    with Database(database_url) as db:
        migrate(db)
    server = serve("127.0.0.1", 0, "t0ken", read_timeout_s=1.0, max_connections=16)
    port, flood = server.server_port, []
    try:
        def open_half() -> None:  # a request line and never the end of the headers, as a stalled client sends
            for _ in range(300):
                connection = socket.create_connection(("127.0.0.1", port), timeout=10)
                connection.sendall(b"GET /metrics HTTP/1.1\r\n")
                flood.append(connection)

        peak = _threads_while(open_half)
        # 16 places; a dropped connection's thread ends a moment after its socket is shut (CI's slow host: 29
        # threads of every kind at the peak, where this counted the process's other threads too)
        assert peak <= 2 * 16, f"{peak} connection threads for 300 half-open connections (cap 16)"
        answer = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer t0ken"},
                              timeout=10)
        assert answer.status_code == 200 and "tandem_up 1.0" in answer.text
        for connection in flood:  # each is closed by the exporter: evicted by a newer one, or after its timeout
            connection.settimeout(5)
            try:
                assert connection.recv(1) == b""
            except ConnectionResetError:
                pass
        wait_for(lambda: _handler_threads() == 0, 5, "the connection threads to end")
    finally:
        for connection in flood:
            connection.close()
        server.shutdown()
        server.server_close()


def _scanned(database_url: str) -> int:
    """Table scans of the tandem schema PostgreSQL counted so far, once the exporter's backend reported them (it
    does within a second of going idle): the value once two looks 0.4 s apart agree, at least 1.2 s after now."""
    def look() -> int:
        with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) FROM pg_stat_user_tables "
                           "WHERE schemaname = 'tandem'")
            return int(cursor.fetchone()[0])

    time.sleep(1.2)
    last, now = -1, look()
    while now != last:
        time.sleep(0.4)
        last, now = now, look()
    return now


def test_concurrent_scrapes_are_answered_from_one_reading_of_the_database(project: Path, database_url: str) -> None:
    with Database(database_url) as db:
        migrate(db)
    server = serve("127.0.0.1", 0, "t0ken")
    url, token = f"http://127.0.0.1:{server.server_port}/metrics", {"Authorization": "Bearer t0ken"}

    def scrape_text() -> str:
        answer = requests.get(url, headers=token, timeout=60)
        assert answer.status_code == 200 and "tandem_up 1.0" in answer.text
        return answer.text

    try:
        scrape_text()  # the first reading of the counters reads their totals too
        time.sleep(1.0)
        scrape_text()
        start = _scanned(database_url)
        scrape_text()
        one = _scanned(database_url) - start
        assert one > 0
        gate, answers = threading.Barrier(8), []

        def concurrent() -> None:
            gate.wait()
            answers.append(scrape_text())

        threads = [threading.Thread(target=concurrent) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _scanned(database_url) - start - one == one, "8 concurrent scrapes read the database more than once"
        durations = {line for text in answers for line in text.splitlines()
                     if line.startswith("tandem_scrape_duration_seconds ")}
        assert len(answers) == 8 and len(durations) == 1  # the figures of one reading
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporters_session_cannot_write(project: Path, database_url: str) -> None:
    with Database(database_url) as db:
        migrate(db)
    collector = PlaneCollector()
    assert value(scrape(collector), "tandem_up") == 1
    assert collector.db is not None
    assert collector.db.run(lambda cursor: (cursor.execute("SHOW statement_timeout"), cursor.fetchone())[1]) \
        == {"statement_timeout": "10s"}
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction, match="read-only transaction"):
        collector.db.run(lambda cursor: cursor.execute("DELETE FROM leases"))
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction, match="read-only transaction"):
        collector.db.run(lambda cursor: cursor.execute("CREATE TABLE exporter_was_here (n int)"))
    collector.db.close()


def test_the_exporter_reads_as_a_role_granted_only_select(project: Path, database_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The grants docs/deploying/security.md gives a monitoring role are enough for every reading, and all it may do."""
    role, parts = f"tandem_monitor_{uuid.uuid4().hex[:8]}", urlsplit(database_url)
    database = parts.path.lstrip("/")
    with Database(database_url) as db:
        migrate(db)
        db.run(lambda cursor: cursor.execute(
            f'CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE "{database}" TO {role}; '
            f"GRANT USAGE ON SCHEMA tandem TO {role}; GRANT SELECT ON ALL TABLES IN SCHEMA tandem TO {role}"))
        try_acquire(db, "trades", "shard-1", "node-a", ttl_s=30.0)
    monkeypatch.setenv("TANDEM_EXPORTER_DATABASE_URL",
                       urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}")))
    collector = PlaneCollector()
    try:
        samples = scrape(collector)
        assert value(samples, "tandem_up") == 1
        assert value(samples, "tandem_lease_epoch", plan="trades", plan_instance="shard-1") == 1
        assert collector.db is not None
        assert collector.db.run(lambda cursor: (cursor.execute("SELECT current_user AS u"), cursor.fetchone())[1]) \
            == {"u": role}
        with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="permission denied"):
            collector.db.run(lambda cursor: (cursor.execute("SET TRANSACTION READ WRITE"),
                                             cursor.execute("DELETE FROM leases")))
    finally:
        if collector.db is not None:
            collector.db.close()
        with Database(database_url) as db:
            db.run(lambda cursor: cursor.execute(f"DROP OWNED BY {role}; DROP ROLE {role}"))


def test_listening_beyond_loopback_without_a_token_is_refused_at_start(project: Path) -> None:
    environment = {name: value for name, value in os.environ.items() if name != "TANDEM_EXPORTER_TOKEN"}
    try:
        started = subprocess.run([shutil.which("tandem") or "tandem", "exporter", "--host", "0.0.0.0", "--port", "0"],
                                 capture_output=True, text=True, env=environment, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("tandem exporter --host 0.0.0.0 without a token is still serving after 30 s")
    assert started.returncode == 2 and "--host 0.0.0.0" in started.stderr
    assert "--token-file" in started.stderr and "TANDEM_EXPORTER_TOKEN" in started.stderr
