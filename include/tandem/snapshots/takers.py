"""Who is taking a snapshot, its progress beat, and giving up snapshots whose taker is gone.

Purpose
    A TAKING snapshot holds back retention: Delta upkeep keeps the output versions it recorded, PostgreSQL retention
    the contribution ids its replay may bring again, and snapshot pruning waits for it. A taker that dies (a killed
    task, a lost host) must not hold them back for the hour a snapshot may take.

How it works
    :func:`this_taker` is recorded with the TAKING row (:func:`tandem.store.snapshots.begin_snapshot`) and
    :class:`TakingBeat` records its progress every :data:`~tandem.snapshots.retention.TAKING_BEAT_S` while it
    takes it. :func:`abandon_stale` (run by snapshot pruning, Delta upkeep and PostgreSQL retention before they
    read the catalog) asks the pure :func:`~tandem.snapshots.retention.taking_abandoned` about each TAKING row,
    telling it whether the taker's process still runs when the row was recorded on this host
    (:func:`taker_alive`), and marks the abandoned ones BAD with the reason.

What it does not do
    It does not delete the partial copy (snapshot pruning does, by the BAD snapshots' rules) nor stop a taker: a
    taker given up that comes back finds its snapshot BAD and fails when it marks it GOOD.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from tandem.host_identity import pids_are_local, this_host_id
from tandem.process_start import TOLERANCE_S, start_since_boot
from tandem.snapshots.retention import TAKING_BEAT_S, taking_abandoned
from tandem.store import snapshots as catalog
from tandem.store.db import Database
from tandem.store.snapshots import SnapshotRecord, Taker

log = logging.getLogger(__name__)


def this_taker() -> Taker:
    """This process, as the taker of a snapshot."""
    return Taker(socket.gethostname(), this_host_id(), os.getpid(), start_since_boot(os.getpid()))


def taker_alive(row: SnapshotRecord) -> bool | None:
    """Whether the recorded taker of ``row`` still runs: its PID with its start time, on this host; ``None`` when no
    taker is recorded or it was recorded on another host (only its progress tells there)."""
    if row.taker_pid is None or row.taker_started_at is None:
        return None
    if not pids_are_local(row.taker_host, row.taker_host_id, socket.gethostname(), this_host_id()):
        return None
    started = start_since_boot(row.taker_pid)
    return started is not None and abs(started - row.taker_started_at) <= TOLERANCE_S


def abandon_stale(db: Database, plan: str) -> list[str]:
    """Mark ``plan``'s TAKING snapshots whose taker is gone BAD (:func:`~tandem.snapshots.retention.taking_abandoned`);
    a line for each, naming it and why."""
    now = catalog.database_now(db)
    given_up = []
    for row in catalog.list_snapshots(db, plan, statuses=(catalog.TAKING,)):
        reason = taking_abandoned(row, now, taker_alive(row))
        if reason is not None and catalog.abandon(db, row, reason):
            given_up.append(f"snapshot {row.id} of {row.instance_id}: {reason}")
    for line in given_up:
        log.warning("%s", line)
    return given_up


class TakingBeat:
    """Records the progress of a snapshot's taker every ``interval_s`` on a connection of its own, from a daemon
    thread, until :meth:`stop` (a context manager)."""

    def __init__(self, database_url: str, snapshot_id: str, interval_s: float = TAKING_BEAT_S) -> None:
        self.database_url, self.snapshot_id, self.interval_s = database_url, snapshot_id, interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"taking-beat-{snapshot_id}", daemon=True)

    def _run(self) -> None:
        try:
            with Database(self.database_url, "tandem-snapshot-beat") as db:
                while not self._stopped.wait(self.interval_s):
                    if not catalog.record_progress(db, self.snapshot_id):
                        return  # finished, or given up as abandoned
        except Exception as exc:  # the snapshot goes on; without beats it may be given up: said in its reason
            log.warning("snapshot %s: its progress beat stopped: %s", self.snapshot_id, exc)

    def __enter__(self) -> TakingBeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
