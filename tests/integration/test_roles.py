"""The role controller's connection, used from two threads at once (the bench's partitions found this)."""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from tandem.config import load_cluster
from tandem.runtime.roles import RoleController
from tandem.store import Database
from tandem.store.leases import check_fence, read_lease
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
            """INSERT INTO plan_instances (instance_id, plan, instance, node, status, updated_at)
               VALUES (%s, %s, %s, %s, 'RUNNING', now())""", (KEY.id, KEY.plan, KEY.instance, KEY.node)))
    roles = RoleController(KEY, cluster.database_url, ttl_s=30)
    roles.start(wants_active=True)
    assert roles.role == "ACTIVE"

    blocker = psycopg2.connect(cluster.database_url, options="-c search_path=tandem")
    renewing = threading.Thread(target=roles.tick, name="liveness")
    try:
        with blocker.cursor() as cursor:
            cursor.execute("SELECT * FROM leases WHERE plan = %s AND instance = %s FOR UPDATE",
                           (KEY.plan, KEY.instance))
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


def _active_and_standby(database_url: str, ttl_s: float) -> tuple[RoleController, RoleController]:
    """Node-a ACTIVE and node-b PASSIVE for ``KEY``'s instance, both registered as running."""
    standby_key = InstanceKey(KEY.plan, KEY.instance, "node-b")
    with Database(database_url) as db:
        migrate(db)
        register_nodes(db, load_cluster())
        for key in (KEY, standby_key):
            db.run(lambda cursor, key=key: cursor.execute(
                """INSERT INTO plan_instances (instance_id, plan, instance, node, status, updated_at)
                   VALUES (%s, %s, %s, %s, 'RUNNING', now())""", (key.id, key.plan, key.instance, key.node)))
    active = RoleController(KEY, database_url, ttl_s=ttl_s)
    active.start(wants_active=True)
    standby = RoleController(standby_key, database_url, ttl_s=ttl_s)
    standby.start(wants_active=False)
    assert (active.role, standby.role) == ("ACTIVE", "PASSIVE")
    return active, standby


def test_a_renewal_cut_off_before_its_commit_does_not_hold_the_standbys_take_over(project, database_url):
    """The active's renewal reached PostgreSQL but its COMMIT never did (its host was cut off between the two):
    its session sits idle in the transaction, holding the lease row's lock. The standby must still take the
    lease once it expires (CI's partition test waited 20 s for a take-over blocked on that lock). The server ends
    the cut-off session after the ttl; the old active, reconnected, finds the lease taken and demotes."""
    cluster = load_cluster()
    active, standby = _active_and_standby(cluster.database_url, ttl_s=2)
    cut_off = active.db.connection()
    with cut_off.cursor() as cursor:  # the renewal's UPDATE, on the active's own session; no COMMIT follows
        cursor.execute("UPDATE leases SET renewed_at = now() WHERE plan = %s AND instance = %s",
                       (KEY.plan, KEY.instance))

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


def test_an_active_publishing_for_longer_than_its_lease_keeps_it(project, database_url):
    """A live active's publish (its fence check, then one statement as slow as 2.5 lease periods, as a roll-up
    on a saturated machine) must not cost it the lease: its beats go on renewing while the publish holds the
    role lock and the lease row's fence lock, and the standby beating meanwhile takes nothing. (CI's supervised
    pair under load failed over by itself: the beat thread waited for the publish's role lock, and a renewal
    waited for the publish's FOR SHARE row lock behind the standby's take-over.) The publish then commits."""
    cluster = load_cluster()
    active, standby = _active_and_standby(cluster.database_url, ttl_s=2)
    active.on_tick(lambda: None)  # periodic work under the role lock, like trimming held outputs
    epoch = active.epoch
    committed: list[bool] = []

    def publish() -> None:
        with active.lock, Database(cluster.database_url) as db:
            def write(cursor) -> None:
                check_fence(cursor, KEY.plan, KEY.instance, KEY.node, epoch)
                cursor.execute("SELECT pg_sleep(5)")
            db.run(write, attempts=1)
            committed.append(True)

    def beats(roles: RoleController, until: float) -> None:
        while time.monotonic() < until:
            roles.tick()
            time.sleep(0.5)

    until = time.monotonic() + 7
    threads = [threading.Thread(target=publish, name="query"),
               threading.Thread(target=beats, args=(active, until), name="active-liveness"),
               threading.Thread(target=beats, args=(standby, until), name="standby-liveness")]
    try:
        for thread in threads:
            thread.start()
        time.sleep(3.5)  # the publish is 3.5 s into its 5-s statement, past the ttl since it began
        with Database(cluster.database_url) as db:
            mid_publish = read_lease(db, KEY.plan, KEY.instance)
        for thread in threads:
            thread.join(timeout=60)
        assert mid_publish.expired_for_s < 0, f"the lease lapsed while its holder published: {mid_publish}"
        assert committed == [True]
        assert (active.role, active.epoch, standby.role) == ("ACTIVE", epoch, "PASSIVE")
        with Database(cluster.database_url) as db:
            lease = read_lease(db, KEY.plan, KEY.instance)
        assert (lease.holder, lease.epoch) == (KEY.node, epoch)
    finally:
        active.stop()
        standby.stop()


def test_a_promotion_publishing_what_was_held_for_longer_than_the_lease_keeps_it(project, database_url):
    """The standby takes the lease and publishes what it held, which takes 2.5 lease periods on a busy
    machine; the node it took over from, back as a standby, beats meanwhile. The lease must stay with the new
    active (renewed while it publishes), not lapse to the old one in the middle of the promotion."""
    cluster = load_cluster()
    active, standby = _active_and_standby(cluster.database_url, ttl_s=2)
    standby.on_promote(lambda epoch: time.sleep(5))
    active.stop()  # gives the lease up

    def holder() -> str | None:
        with Database(cluster.database_url) as db:
            return read_lease(db, KEY.plan, KEY.instance).holder

    promoting = threading.Thread(target=standby.tick, name="node-b-liveness")  # takes the lease, publishes 5 s
    promoting.start()
    returned = RoleController(KEY, cluster.database_url, ttl_s=2)  # node-a, back as a standby
    try:
        deadline = time.monotonic() + 10
        while holder() != "node-b" and time.monotonic() < deadline:
            time.sleep(0.05)
        returned.start(wants_active=False)
        while promoting.is_alive():
            returned.tick()
            time.sleep(0.5)
        with Database(cluster.database_url) as db:
            lease = read_lease(db, KEY.plan, KEY.instance)
        assert (lease.holder, lease.epoch, returned.role) == ("node-b", standby.epoch, "PASSIVE"), lease
    finally:
        promoting.join(timeout=30)
        returned.stop()
        standby.stop()


def test_a_promotion_that_cannot_publish_what_was_held_gives_the_lease_back(project, database_url):
    """Publishing the held outputs fails for a reason no retry mends (here a bug in a sink): the instance keeps
    the failure (it then ends FAILED) and the lease it took is given back at once, not renewed past it by the
    thread that renewed it during the promotion."""
    cluster = load_cluster()
    active, standby = _active_and_standby(cluster.database_url, ttl_s=2)

    def broken(epoch: int) -> None:
        time.sleep(1)  # long enough for a renewal during the promotion
        raise ValueError("a sink's bug")

    standby.on_promote(broken)
    active.stop()
    try:
        standby.tick()
        assert standby.role == "PASSIVE" and "a sink's bug" in (standby.failure or ""), standby.failure
        time.sleep(1)
        with Database(cluster.database_url) as db:
            lease = read_lease(db, KEY.plan, KEY.instance)
        assert lease.holder == "node-b" and lease.expired_for_s > 0, lease
    finally:
        standby.stop()
