"""An upgrade whose new version identifies rows otherwise is refused, on real PostgreSQL and Delta (issue 60).

The old version publishes readings as the ACTIVE while the new one, a shadow standby under verification, holds the
same readings and trims by what the ACTIVE published, as the runtime does batch by batch. The new version rounds
``temp`` (a "fix"), and ``temp`` is a field of the ``hot`` events' key: every hot event gets another id. Before, the
shadow compared only the rows whose ids the ACTIVE published, found nothing to differ, passed, and at the hand-over
published every held hot event again under its new id. Now the rows the ACTIVE never publishes under their ids,
though it published rows the shadow held two batches later, are counted as only in the new version, and neither a
hand-over (even confirmed) nor a rollback takes them. A version that changes nothing passes; a table's and the
latest kind's values are compared (they were not).
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from tandem.config import load_cluster, load_plan
from tandem.declarations import event_id
from tandem.layout import delta_table_dir
from tandem.outputs import kind_of
from tandem.outputs.base import UNMATCHED_AFTER, BatchInfo
from tandem.runtime.verification import ASKED_AGAIN_AFTER_S, RollbackWatch, ShadowVerification
from tandem.store import Database, migrate, upgrades
from tandem.store.leases import try_acquire
from tandem.store.registry import InstanceKey
from tandem.supervisor.upgrade import DIFFER, PASS, twice_published, verdict

pytestmark = pytest.mark.integration
PLAN, INSTANCE, QUERY = "rooms", "rooms-1", "readings"
T0 = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)
PLAN_YAML = """name: rooms
description: hot readings, readings per room and each room's last reading
streams:
  readings:
    partitions: 1
    key: room
    event_time: at
    fields:
      room: {type: string, not_empty: true}
      at: {type: epoch_millis}
      temp: {type: double}
groups:
  rooms: {parallel: 1, queries: [readings]}
outputs:
  hot:
    kind: events
    key: [room, at, temp]
    time: at
  per_room:
    kind: table
    key: [room]
    values: [readings, temp_sum]
    id: [room, at]
  last_reading:
    kind: latest
    key: [room]
    time: at
    values: [temp]
    id: [room, at]
nodes: [node-a, node-b]
"""
SCHEMA = pa.schema([("room", pa.string()), ("at", pa.timestamp("us", tz="UTC")), ("temp", pa.float64()),
                    ("readings", pa.float64()), ("temp_sum", pa.float64())])
BATCHES = 6


@pytest.fixture
def rooms(project: Path, database_url: str):
    (project / "conf" / "plans" / "rooms.yaml").write_text(PLAN_YAML)
    with Database(database_url) as db:
        migrate(db)
    cluster = load_cluster()
    return cluster, load_plan(PLAN, cluster)


def readings(batch: int, rounded: bool, summed: bool = True) -> pa.Table:
    """Batch ``batch``'s readings as a version of the query emits them (``rounded``: the new version's temp)."""
    rows = []
    for n in range(4):
        temp = 20 + batch + n / 10 + 0.037  # never a whole tenth: rounding changes every one
        temp = round(temp, 1) if rounded else temp
        rows.append({"room": f"r{n % 2}", "at": T0 + timedelta(seconds=batch * 10 + n), "temp": temp,
                     "readings": 1.0, "temp_sum": temp if summed else 0.0})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


class Version:
    """One version's sinks of the query's three outputs, on one node."""

    def __init__(self, cluster, plan, node: str) -> None:
        self.key = InstanceKey(PLAN, INSTANCE, node)
        self.sinks = {output: kind_of(plan, output).sink(plan, output, self.key, cluster.database_url,
                                                         delta_table_dir(cluster, PLAN, output))
                      for output in ("hot", "per_room", "last_reading")}

    def verify(self, verification: ShadowVerification) -> None:
        query = verification.for_query(QUERY)
        for sink in self.sinks.values():
            sink.verify_with(query)

    def publish(self, rows: pa.Table, batch: int, epoch: int) -> None:
        for sink in self.sinks.values():
            sink.publish(rows, BatchInfo(self.key, batch, epoch, datetime.now(timezone.utc)))

    def hold_and_trim(self, rows: pa.Table, batch: int) -> None:
        """As a standby's publisher does with a batch: hold it in every output, then trim each."""
        for sink in self.sinks.values():
            sink.hold(rows, batch)
        self.trim()

    def trim(self) -> None:
        for sink in self.sinks.values():
            sink.trim()

    def close(self) -> None:
        for sink in self.sinks.values():
            sink.db.close()


def run_pair(cluster, plan, db: Database, active_node: str, standby_node: str, *, active_rounds: bool,
             standby_rounds: bool, version: str, summed: bool = True) -> list[upgrades.OutputCheck]:
    """The ACTIVE publishes each batch, the standby (under verification, running ``version``) holds and trims it,
    each rounding temp or not; what the standby's verification recorded."""
    active, standby = Version(cluster, plan, active_node), Version(cluster, plan, standby_node)
    verification = ShadowVerification(standby.key, cluster.database_url, version)
    standby.verify(verification)
    epoch = try_acquire(db, PLAN, INSTANCE, active_node, 60.0)
    try:
        for batch in range(BATCHES):
            active.publish(readings(batch, rounded=active_rounds, summed=summed), batch, epoch)
            standby.hold_and_trim(readings(batch, rounded=standby_rounds, summed=summed), batch)
        # the ACTIVE's next batch (a batch is proven once the ACTIVE published again after its rows), then a
        # heartbeat's trim
        active.publish(readings(BATCHES, rounded=active_rounds, summed=summed), BATCHES, epoch)
        time.sleep(ASKED_AGAIN_AFTER_S)  # heartbeats are a second apart: the ACTIVE's newest publish is asked again
        standby.trim()
    finally:
        active.close()
        standby.close()
        verification.db.close()
    return upgrades.checks(db, PLAN, INSTANCE, standby_node, version)


def reset(db: Database, cluster) -> None:
    db.run(lambda c: c.execute("DELETE FROM output_events; DELETE FROM output_contributions; "
                               "DELETE FROM output_table_rows; DELETE FROM output_latest; DELETE FROM leases; "
                               "DELETE FROM upgrade_checks"))
    for output in ("hot", "per_room", "last_reading"):
        shutil.rmtree(delta_table_dir(cluster, PLAN, output), ignore_errors=True)


def outcome(checks) -> str:
    return verdict(checks, 60.0, verify_s=5, min_rows=1, behind_s=0.0, max_behind_s=2).outcome


def test_a_new_version_that_identifies_rows_otherwise_is_refused_at_the_hand_over_and_at_a_rollback(rooms) -> None:
    cluster, plan = rooms
    with Database(cluster.database_url) as db:
        # the same version on both sides: every row matched, nothing only on one side
        same = run_pair(cluster, plan, db, "node-a", "node-b", active_rounds=False, standby_rounds=False,
                        version="v1")
        assert {c.output: (c.checked > 0, c.differing, c.unmatched) for c in same} == {
            "hot": (True, 0, 0), "per_room": (True, 0, 0), "last_reading": (True, 0, 0)}, same
        assert outcome(same) == PASS and twice_published(same) is None
        reset(db, cluster)

        # the new version rounds temp: every hot event's id changes; the table's ids (room, at) do not
        checks = {c.output: c for c in run_pair(cluster, plan, db, "node-a", "node-b", active_rounds=False,
                                                standby_rounds=True, version="v2", summed=False)}
        held_long_enough = 4 * (BATCHES - UNMATCHED_AFTER)  # rows of batches the ACTIVE has published two past
        assert checks["hot"].unmatched == held_long_enough and checks["hot"].checked == 0, checks["hot"]
        assert checks["per_room"].checked == 4 * BATCHES and checks["per_room"].differing == 0
        old_id = event_id(PLAN, "hot", {"room": "r0", "at": T0, "temp": 20.037})
        assert old_id not in str(checks["hot"].samples) and "only in this version" in checks["hot"].samples[0]
        judged = verdict(list(checks.values()), 60.0, verify_s=5, min_rows=1, behind_s=0.0, max_behind_s=2)
        assert judged.outcome == DIFFER and "hot only in this version" in judged.line, judged.line
        assert "publish their events again under new ids" in twice_published(list(checks.values()))
        reset(db, cluster)

        # after a hand-over the old version is the standby: what it holds under its ids, the new ACTIVE never
        # published under them; the rollback watch attaches its verification, and a rollback is refused
        upgrades.begin(db, upgrades.Upgrade(PLAN, INSTANCE, upgrades.VERIFYING, "v1", "v2", "node-a", "node-b",
                                            "test"))
        attached: list[ShadowVerification] = []
        watch = RollbackWatch(InstanceKey(PLAN, INSTANCE, "node-a"), "v1", cluster.database_url, lambda: True,
                              attached.append, every_s=0.0)
        watch()
        assert not attached, "not while the upgrade verifies"
        upgrades.set_state(db, PLAN, INSTANCE, upgrades.HANDED_OVER, "test")
        RollbackWatch(InstanceKey(PLAN, INSTANCE, "node-b"), "v2", cluster.database_url, lambda: True,
                      attached.append, every_s=0.0)()
        assert not attached, "not on the new version's node"
        watch()
        assert [(v.key.node, v.to_version) for v in attached] == [("node-a", "v1")]
        attached[0].db.close()
        back = run_pair(cluster, plan, db, "node-b", "node-a", active_rounds=True, standby_rounds=False,
                        version="v1", summed=False)
        assert twice_published(back) is not None and [c.unmatched for c in back if c.output == "hot"] == [
            4 * (BATCHES - UNMATCHED_AFTER)]


def test_a_table_s_and_the_latest_kind_s_values_are_compared_under_the_same_ids(rooms) -> None:
    """The new version sums temp rounded, under the same contribution ids and the same latest rows' ranks: each
    contribution and each room's last reading differs in its value (before, neither kind compared values)."""
    cluster, plan = rooms

    def rounded_values(batch: int, rounded: bool) -> pa.Table:
        table = readings(batch, rounded=False)
        if not rounded:
            return table
        return table.set_column(2, "temp", pa.array([round(t, 1) for t in table["temp"].to_pylist()]))\
            .set_column(4, "temp_sum", pa.array([round(t, 1) for t in table["temp_sum"].to_pylist()]))

    with Database(cluster.database_url) as db:
        active, shadow = Version(cluster, plan, "node-a"), Version(cluster, plan, "node-b")
        verification = ShadowVerification(shadow.key, cluster.database_url, "v3")
        shadow.verify(verification)
        epoch = try_acquire(db, PLAN, INSTANCE, "node-a", 60.0)
        for batch in range(2):
            # the hot events' ids change too here (temp is in their key): only the other outputs are asserted
            active.publish(rounded_values(batch, rounded=False), batch, epoch)
            shadow.hold_and_trim(rounded_values(batch, rounded=True), batch)
        for sink in (*active.sinks.values(), *shadow.sinks.values()):
            sink.db.close()
        verification.db.close()
        checks = {c.output: c for c in upgrades.checks(db, PLAN, INSTANCE, "node-b", "v3")}
    assert (checks["per_room"].checked, checks["per_room"].differing) == (8, 8), checks["per_room"]
    assert "temp_sum 20.037 (old) != 20.0 (new)" in " ".join(checks["per_room"].samples), checks["per_room"].samples
    # the latest kind: the new rows rank as the old (id: room, at), so each room's last reading is compared
    assert checks["last_reading"].differing == checks["last_reading"].checked > 0, checks["last_reading"]
    assert "temp" in checks["last_reading"].samples[0] and "(new)" in checks["last_reading"].samples[0]
