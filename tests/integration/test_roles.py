"""The role controller's connection, used from two threads at once (the bench's partitions found this)."""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from tandem.config import load_cluster
from tandem.runtime.roles import RoleController
from tandem.store import Database
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, register_nodes

pytestmark = pytest.mark.integration
KEY = InstanceKey("trades", "shard-1", "node-a")


def test_a_demotion_during_a_renewal_that_hangs_waits_for_it_instead_of_failing(project, database_url):
    """The liveness thread renews the lease while the lease row is locked (a renewal hanging on the
    network looks the same from here); a query thread, fenced meanwhile, demotes. The demotion must
    wait for the renewal and record DEMOTED: it used to raise "connection cannot be re-entered
    recursively" and fail the query."""
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
        register_nodes(db, cluster)
        db.run(lambda cursor: cursor.execute(
            """INSERT INTO plan_instances (instance_id, plan, shard_id, node, status, updated_at)
               VALUES (%s, %s, %s, %s, 'RUNNING', now())""", (KEY.id, KEY.plan, KEY.shard_id, KEY.node)))
    roles = RoleController(KEY, cluster.database_url, ttl_s=30)
    roles.start(wants_active=True)
    assert roles.role == "ACTIVE"

    blocker = psycopg2.connect(cluster.database_url, options="-c search_path=tandem")
    renewing = threading.Thread(target=roles.tick, name="liveness")
    try:
        with blocker.cursor() as cursor:
            cursor.execute("SELECT * FROM leases WHERE plan = %s AND shard_id = %s FOR UPDATE",
                           (KEY.plan, KEY.shard_id))
            renewing.start()
            time.sleep(1.0)  # the renewal now waits for the row lock inside its transaction
            released = threading.Timer(1.0, blocker.rollback)
            released.start()
            roles.demote("fenced while publishing")  # the query thread's call
        renewing.join(timeout=30)
    finally:
        blocker.close()
        roles.stop()
    assert not renewing.is_alive()
    assert roles.role == "PASSIVE"
    with Database(cluster.database_url) as db:
        events = db.run(lambda cursor: (cursor.execute(
            "SELECT kind, reason FROM failover_events WHERE plan = %s ORDER BY id", (KEY.plan,)), cursor.fetchall())[1])
        role = db.run(lambda cursor: (cursor.execute(
            "SELECT role FROM plan_instances WHERE instance_id = %s", (KEY.id,)), cursor.fetchone())[1])
    assert [(e["kind"], e["reason"]) for e in events][-1] == ("DEMOTED", "fenced while publishing"), events
    assert role["role"] == "PASSIVE"


def test_a_renewal_cut_off_before_its_commit_does_not_hold_the_standbys_take_over(project, database_url):
    """The active's renewal reached PostgreSQL but its COMMIT never did (its host was cut off between the two):
    its session sits idle in the transaction, holding the lease row's lock. The standby must still take the
    lease once it expires (CI's partition test waited 20 s for a take-over blocked on that lock). The server ends
    the cut-off session after the ttl; the old active, reconnected, finds the lease taken and demotes."""
    cluster = load_cluster()
    standby_key = InstanceKey(KEY.plan, KEY.shard_id, "node-b")
    with Database(cluster.database_url) as db:
        migrate(db)
        register_nodes(db, cluster)
        for key in (KEY, standby_key):
            db.run(lambda cursor, key=key: cursor.execute(
                """INSERT INTO plan_instances (instance_id, plan, shard_id, node, status, updated_at)
                   VALUES (%s, %s, %s, %s, 'RUNNING', now())""", (key.id, key.plan, key.shard_id, key.node)))
    active = RoleController(KEY, cluster.database_url, ttl_s=2)
    active.start(wants_active=True)
    standby = RoleController(standby_key, cluster.database_url, ttl_s=2)
    standby.start(wants_active=False)
    assert (active.role, standby.role) == ("ACTIVE", "PASSIVE")
    cut_off = active.db.connection()
    with cut_off.cursor() as cursor:  # the renewal's UPDATE, on the active's own session; no COMMIT follows
        cursor.execute("UPDATE leases SET renewed_at = now() WHERE plan = %s AND shard_id = %s",
                       (KEY.plan, KEY.shard_id))

    def take_over() -> None:
        deadline = time.monotonic() + 30
        while standby.role != "ACTIVE" and time.monotonic() < deadline:
            standby.tick()
            time.sleep(0.5)

    taking = threading.Thread(target=take_over, name="standby-liveness")
    taking.start()
    taking.join(timeout=40)
    try:
        assert not taking.is_alive(), "the standby's take-over still waits for the cut-off renewal's row lock"
        assert standby.role == "ACTIVE"
        for _ in range(3):  # its session was ended (the beat fails and reconnects), then the renewal is refused
            active.tick()
        assert active.role == "PASSIVE"
    finally:
        cut_off.close()  # releases the lock if the server did not (without the fix), so the thread can end
        taking.join(timeout=30)
        active.stop()
        standby.stop()
