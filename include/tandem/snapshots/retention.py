"""Which snapshots to prune, which landing files to delete, which snapshot to restore (pure).

Purpose
    Snapshots and input files must not pile up until someone deletes them by hand (the seeds'
    complaint), yet retention must never delete what a restore needs. The snapshot DAG, the
    maintenance DAG and ``tandem restore`` ask three questions, answered here without touching the
    world so every rule has a unit test with hand-written catalog rows:

    - :func:`decide_retention`: which snapshots to prune (catalog rows, ``snapshot.keep``, now);
    - :func:`decide_landing_retention`: which landing files may be deleted (the directory's files,
      what each instance has processed, what each kept snapshot's cut has processed);
    - :func:`choose_snapshot`: which snapshot a restore uses (by id or the newest good one).

    Every decision carries a reason, so the DAGs can log what they did and why.

How it works
    Snapshot retention, per (plan, instance), newest first (``taken_at``, then id):

    1. The newest ``keep`` GOOD snapshots are kept; older GOOD ones are pruned. ``keep`` is at
       least 1, so the newest good snapshot is never pruned.
    2. BAD snapshots cannot be restored without force, but the newest one is worth a look: it is
       kept for inspection as long as it is newer than the oldest kept good snapshot (or there is
       no good one). Every other BAD snapshot is pruned, so repeated failures do not pile up.
    3. A TAKING snapshot is being taken (WAIT) while its taker may still be at work
       (:func:`taking_abandoned`): its process is alive (known on the taker's host only) and it
       showed progress within ``TAKING_STALE_S`` (its taker beats every ``TAKING_BEAT_S``); a row
       without a recorded taker (from an earlier version) while it is younger than
       ``taking_timeout_s``. Otherwise it was abandoned: treated as failed and pruned (its partial
       copy deleted; the catalog row stays with the reason). Delta upkeep and PostgreSQL retention,
       which keep what TAKING snapshots may need, give such a snapshot up first
       (:func:`tandem.snapshots.takers.abandon_stale`), so a dead taker holds nothing back.
    4. PRUNED rows are history: no decision.

    Landing retention: a file may be deleted when every instance that may resume from its own
    checkpoint has processed it (a committed batch of each of its queries read it, see
    :func:`tandem.checkpoints.processed_files`), and when every kept snapshot's cut has processed it,
    because a restore from a snapshot reprocesses exactly the input after its cut. Requiring every
    kept cut, not only the oldest one, is the same rule when cuts grow with time and stays safe
    when they do not (a newer snapshot cut from a standby that lagged behind). With no instance,
    or no kept snapshot, nothing is deleted: nothing proves the input is no longer needed. Hidden
    and temporary files (``.name``, ``_name``) are never deleted: the producer writes
    ``.<name>.tmp`` before renaming it into place. Paths are compared after normalisation
    (:func:`landing_file_key`), so ``file:`` URIs from Spark's logs match plain paths.

    Which checkpoints count (:func:`guarding_nodes`): the lease holder's (it resumes from its own), every
    node's whose instance beat or whose checkpoint changed within :data:`GUARD_WINDOW_S` (it runs, or is being
    launched from a fresh re-sync), and every node's while the instance has no lease yet. Any other node's
    checkpoint is left behind: such a node launches again after a re-sync from the holder, which replaces its
    checkpoint (a cold standby killed and never needed again would otherwise hold every file back forever); a
    re-sync that fails does not fall back to a checkpoint left behind (:mod:`tandem.resync`).

    Choosing a snapshot: by id, a GOOD one is returned, a BAD one only with ``force``, a TAKING or
    PRUNED one never (it is incomplete or gone); without an id, the newest GOOD snapshot of the
    one (plan, instance) the rows belong to.

What it does not do
    It reads and deletes nothing: callers read the catalog (:mod:`tandem.store.snapshots`), list
    landing directories and read file-source logs, then act on the decisions. A kept BAD snapshot
    does not hold back landing files: it is only for inspection, and a forced restore of it may
    miss input that was deleted already.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote, urlsplit

from tandem.checkpoints import GUARD_WINDOW_S
from tandem.errors import SnapshotError, SnapshotRefused
from tandem.store.snapshots import BAD, GOOD, PRUNED, TAKING, SnapshotRecord

KEEP, PRUNE, WAIT = "KEEP", "PRUNE", "WAIT"
TAKING_TIMEOUT_S = 3600.0
"""A snapshot still TAKING this long after it started, without a recorded taker, was abandoned (default of
``decide_retention``)."""
TAKING_BEAT_S = 10.0
"""How often a snapshot's taker records its progress while it takes it (:class:`tandem.snapshots.takers.TakingBeat`)."""
TAKING_STALE_S = 120.0
"""A TAKING snapshot whose taker recorded no progress for this long was abandoned (twelve beats missed)."""


def taking_abandoned(row: SnapshotRecord, now: datetime, taker_alive: bool | None, *,
                     stale_after_s: float = TAKING_STALE_S, timeout_s: float = TAKING_TIMEOUT_S) -> str | None:
    """Why the TAKING snapshot ``row`` counts as abandoned, or ``None`` while its taker may still be at work (pure).

    ``taker_alive``: whether the taker's recorded process still runs, which only its host can tell (``None``
    elsewhere, or no taker recorded). Abandoned: its process is gone; or it recorded no progress for
    ``stale_after_s``; or, without a recorded taker (an earlier version's row), it started ``timeout_s`` ago.
    """
    if row.status != TAKING:
        return None
    if taker_alive is False:
        return (f"abandoned: its taker (pid {row.taker_pid} on {row.taker_host or '?'}) is gone; treated as "
                "failed")
    if row.progress_at is not None:
        silent_s = (now - row.progress_at).total_seconds()
        if silent_s < stale_after_s:
            return None
        return (f"abandoned: no progress from its taker (pid {row.taker_pid} on {row.taker_host or '?'}) for "
                f"{silent_s:.0f} s (it beats every {TAKING_BEAT_S:g} s; given up after {stale_after_s:.0f} s); "
                "treated as failed")
    age_s = (now - row.taken_at).total_seconds()
    if age_s < timeout_s:
        return None
    return f"abandoned: still TAKING {age_s:.0f} s after it started (timeout {timeout_s:.0f} s); treated as failed"


@dataclass(frozen=True)
class SnapshotDecision:
    """What retention does with one snapshot: KEEP it, PRUNE it (delete its files), or WAIT (being taken)."""

    snapshot_id: str
    plan: str
    instance: str
    status: str
    action: str
    reason: str

    def describe(self) -> str:
        return f"{self.action.lower()} {self.snapshot_id} ({self.status}): {self.reason}"


@dataclass(frozen=True)
class RetentionPlan:
    """The decisions for every snapshot that is not PRUNED yet, newest first per instance."""

    decisions: tuple[SnapshotDecision, ...]

    @property
    def to_prune(self) -> tuple[SnapshotDecision, ...]:
        return tuple(d for d in self.decisions if d.action == PRUNE)

    def kept_good(self, plan: str, instance: str) -> tuple[str, ...]:
        """Ids of the GOOD snapshots of one (plan, instance) that stay, newest first (their cuts guard landing files)."""
        return tuple(d.snapshot_id for d in self.decisions
                     if (d.plan, d.instance) == (plan, instance) and d.status == GOOD and d.action == KEEP)

    def describe(self) -> list[str]:
        return [d.describe() for d in self.decisions]


def decide_retention(rows: Iterable[SnapshotRecord], keep: int, now: datetime, *,
                     taking_timeout_s: float = TAKING_TIMEOUT_S,
                     takers_alive: Mapping[str, bool | None] | None = None) -> RetentionPlan:
    """Which snapshots to keep, prune or leave alone, per (plan, instance); see the module docstring.

    Args:
        rows: catalog rows (any plans and instances; PRUNED rows are skipped).
        keep: GOOD snapshots to keep per instance (``snapshot.keep``), at least 1.
        now: the current time on the clock of ``taken_at`` (PostgreSQL's; time-zone aware).
        taking_timeout_s: age after which a TAKING snapshot without a recorded taker counts as abandoned.
        takers_alive: per TAKING snapshot id, whether its taker's process runs (``None`` or missing: not known
            here); see :func:`taking_abandoned`.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer of at least 1 (the newest good snapshot is never pruned), "
                         f"got {keep!r}")
    if now.tzinfo is None:
        raise ValueError(f"now must carry a time zone, got {now!r}")
    if taking_timeout_s <= 0:
        raise ValueError(f"taking_timeout_s must be positive, got {taking_timeout_s!r}")
    by_instance: dict[tuple[str, str], list[SnapshotRecord]] = defaultdict(list)
    for row in rows:
        if row.status not in (TAKING, GOOD, BAD, PRUNED):
            raise ValueError(f"snapshot {row.id} has an unknown status {row.status!r}")
        if row.status != PRUNED:
            by_instance[(row.plan, row.instance)].append(row)
    decisions: list[SnapshotDecision] = []
    for (plan, instance) in sorted(by_instance):
        decisions.extend(_instance_retention(_newest_first(by_instance[(plan, instance)]), keep, now, taking_timeout_s,
                                             takers_alive or {}))
    return RetentionPlan(tuple(decisions))


def _instance_retention(rows: list[SnapshotRecord], keep: int, now: datetime, taking_timeout_s: float,
                        takers_alive: Mapping[str, bool | None]) -> list[SnapshotDecision]:
    goods = [r for r in rows if r.status == GOOD]
    good_rank = {r.id: rank for rank, r in enumerate(goods, start=1)}
    kept_goods = goods[:keep]
    oldest_kept = kept_goods[-1] if kept_goods else None
    bads = [r for r in rows if r.status == BAD]
    inspected = bads[0] if bads and (oldest_kept is None or _order(bads[0]) > _order(oldest_kept)) else None
    where = f"{rows[0].plan}/{rows[0].instance}"

    def decision(row: SnapshotRecord, action: str, reason: str) -> SnapshotDecision:
        return SnapshotDecision(row.id, row.plan, row.instance, row.status, action, reason)

    decisions = []
    for row in rows:
        if row.status == GOOD:
            rank = good_rank[row.id]
            if rank == 1:
                decisions.append(decision(row, KEEP, f"the newest good snapshot of {where}"))
            elif rank <= keep:
                decisions.append(decision(row, KEEP, f"good snapshot {rank} of the {keep} kept of {where}"))
            else:
                decisions.append(decision(row, PRUNE, f"good, but older than the {keep} newest good snapshots "
                                                      f"of {where} (oldest kept: {oldest_kept.id})"))
        elif row.status == BAD:
            if row is inspected:
                decisions.append(decision(row, KEEP, "the newest bad snapshot, kept for inspection"
                                          + (f" (newer than the oldest kept good one, {oldest_kept.id})"
                                             if oldest_kept else " (no good snapshot exists)")))
            elif oldest_kept is not None and _order(row) < _order(oldest_kept):
                decisions.append(decision(row, PRUNE, f"bad, and older than the oldest kept good snapshot "
                                                      f"{oldest_kept.id}"))
            else:
                decisions.append(decision(row, PRUNE, f"bad; only the newest bad snapshot ({bads[0].id}) is kept "
                                                      "for inspection"))
        else:
            abandoned = taking_abandoned(row, now, takers_alive.get(row.id), timeout_s=taking_timeout_s)
            if abandoned is not None:
                decisions.append(decision(row, PRUNE, abandoned))
            else:
                age_s = max((now - row.taken_at).total_seconds(), 0.0)
                decisions.append(decision(row, WAIT, f"being taken for {age_s:.0f} s" + (
                    f" (abandoned after {taking_timeout_s:.0f} s)" if row.progress_at is None else
                    f" (its taker beats; abandoned once it is gone or silent for {TAKING_STALE_S:.0f} s)")))
    return decisions


def _order(row: SnapshotRecord) -> tuple[datetime, str]:
    return (row.taken_at, row.id)


def _newest_first(rows: Iterable[SnapshotRecord]) -> list[SnapshotRecord]:
    return sorted(rows, key=_order, reverse=True)


# ------------------------------------------------------------------------------------------------
# Landing files


@dataclass(frozen=True)
class LandingDecision:
    """Which files of one landing directory may be deleted, which leave it for ``retained/``, and why each other
    file stays.

    ``delete`` and ``retire`` hold the paths as they were given in ``files``, sorted; ``keep`` maps every other
    given path to the reason it stays. A retired file is one no restart and no restore needs any more but a
    backfill or reconcile may (younger than ``maintenance.keep_input``): it moves to
    :func:`tandem.layout.retained_dir`, out of the folder the streams list every trigger.
    """

    delete: tuple[str, ...]
    keep: Mapping[str, str]
    retire: tuple[str, ...] = ()

    def describe(self) -> list[str]:
        """One line per reason with its file count (for task logs), deletions and moves first."""
        lines = []
        if self.delete:
            lines.append(f"delete {len(self.delete)} file(s): processed by every instance and inside every "
                         "kept snapshot's cut")
        if self.retire:
            lines.append(f"move {len(self.retire)} file(s) to retained/: processed by every instance and inside "
                         "every kept snapshot's cut, younger than maintenance.keep_input (a backfill or reconcile "
                         "recomputes from them)")
        counts: dict[str, int] = defaultdict(int)
        for reason in self.keep.values():
            counts[reason] += 1
        lines.extend(f"keep {count} file(s): {reason}" for reason, count in sorted(counts.items()))
        return lines


def landing_file_key(path: str) -> str:
    """A landing file's path in one form: ``file:`` URIs (as Spark's file-source log writes them) become paths."""
    if path.startswith("file:"):
        path = unquote(urlsplit(path).path)
    return os.path.normpath(path)


def files_of_stream(by_source: Sequence[Collection[str] | None], stream_dir: str) -> frozenset[str] | None:
    """What a query processed of one stream's landing files, given what each of its sources processed (pure).

    ``by_source``: per source of the query, the files it processed (``None``: not a file source).
    A source reads the stream when one of its files lies under ``stream_dir``
    (``landing/<stream>``). Returns the union of those sources' files; an empty set when no source
    is known to read the stream but one has read nothing yet (it may read this stream: nothing of
    it counts as processed); ``None`` when the query does not read the stream (it is no reader).
    """
    if not by_source:
        return frozenset()  # nothing committed yet: a reader that has processed nothing
    prefix = landing_file_key(stream_dir) + os.sep
    files = [frozenset(landing_file_key(f) for f in listed) for listed in by_source if listed is not None]
    reading = [listed for listed in files if any(f.startswith(prefix) for f in listed)]
    if reading:
        return frozenset().union(*reading)
    return frozenset() if any(not listed for listed in files) else None


def guarding_nodes(nodes: Iterable[str], holder: str | None, beat_age_s: Mapping[str, float],
                   checkpoint_age_s: Mapping[str, float], window_s: float = GUARD_WINDOW_S) -> frozenset[str]:
    """The nodes of an instance whose own checkpoints landing retention must respect (pure; see the module).

    ``holder``: the lease's holder, ``None`` while the instance has no lease (then every node counts);
    ``beat_age_s`` / ``checkpoint_age_s``: seconds since each node's instance beat and its checkpoint last
    changed (a node missing from one has none).
    """
    nodes = list(nodes)
    if holder is None:
        return frozenset(nodes)
    return frozenset(node for node in nodes if node == holder or beat_age_s.get(node, window_s + 1) <= window_s
                     or checkpoint_age_s.get(node, window_s + 1) <= window_s)


def decide_landing_retention(files: Iterable[str], processed_by: Mapping[str, Collection[str]],
                             kept_cuts: Mapping[str, Collection[str]],
                             recent: Collection[str] = ()) -> LandingDecision:
    """Which landing files every instance and every kept snapshot's cut have processed (may be deleted).

    Args:
        files: the files in one landing directory (paths or ``file:`` URIs).
        processed_by: per reader, the files its committed batches read
            (:func:`tandem.checkpoints.processed_files`). A reader is one query of one
            instance (e.g. ``trades/shard-1/node-a/aggregates``): every query of every instance
            that reads this directory and may resume from its own checkpoint (the running ones;
            an instance that restarts after a re-sync takes the active's cut and needs nothing older).
        kept_cuts: per kept GOOD snapshot (of every plan reading this directory; one key per query
            cut when a snapshot holds several), the files its cut had read, i.e. those processed at
            or before the cut.
        recent: files younger than a reader plan's ``maintenance.keep_input`` (a backfill or a
            reconcile run recomputes from them): retired instead of deleted once nothing else needs them.
    """
    processed = {instance: {landing_file_key(f) for f in listed} for instance, listed in processed_by.items()}
    cuts = {snapshot: {landing_file_key(f) for f in listed} for snapshot, listed in kept_cuts.items()}
    delete: list[str] = []
    retire: list[str] = []
    keep: dict[str, str] = {}
    for original in files:
        key = landing_file_key(original)
        name = os.path.basename(key)
        missing_instances = sorted(i for i, seen in processed.items() if key not in seen)
        missing_cuts = sorted(s for s, seen in cuts.items() if key not in seen)
        if name.startswith((".", "_")):
            keep[original] = "hidden or temporary file (the file source ignores it; a producer may be writing it)"
        elif not processed:
            keep[original] = "no instance given: nothing shows the file was processed"
        elif not cuts:
            keep[original] = "no good snapshot kept: a restore from scratch would need every file"
        elif missing_instances:
            keep[original] = f"not yet processed by {', '.join(missing_instances)}"
        elif missing_cuts:
            keep[original] = (f"after the cut of snapshot {missing_cuts[0]} (a restore from it reprocesses this file)"
                              if len(missing_cuts) == 1 else
                              f"after the cuts of snapshots {', '.join(missing_cuts)} "
                              "(a restore from them reprocesses this file)")
        elif original in recent:
            retire.append(original)
        else:
            delete.append(original)
    return LandingDecision(tuple(sorted(delete)), keep, tuple(sorted(retire)))


# ------------------------------------------------------------------------------------------------
# Restore


def choose_snapshot(rows: Iterable[SnapshotRecord], snapshot_id: str | None = None, latest_good: bool = False,
                    force: bool = False) -> SnapshotRecord:
    """The snapshot a restore uses: ``snapshot_id``, or the newest GOOD one (``latest_good``, the default).

    Raises:
        SnapshotRefused: the snapshot is BAD and ``force`` is not set, or it is TAKING or PRUNED
            (``force`` does not help: its copy is incomplete or deleted).
        SnapshotError: the id is unknown; or, by latest good, there is no GOOD snapshot or the
            rows span several (plan, instance) pairs (each instance is restored from its own snapshot).
        ValueError: both ``snapshot_id`` and ``latest_good`` were given.
    """
    rows = _newest_first(rows)
    if snapshot_id is not None and latest_good:
        raise ValueError("give a snapshot id or latest_good, not both")
    if snapshot_id is None:
        return _latest_good(rows)
    found = next((r for r in rows if r.id == snapshot_id), None)
    if found is None:
        newest = ", ".join(r.id for r in rows[:3]) or "none"
        raise SnapshotError(f"no snapshot {snapshot_id!r} in the catalog (newest: {newest})")
    if found.status == GOOD:
        return found
    if found.status == BAD:
        if force:
            return found
        raise SnapshotRefused(f"snapshot {found.id} is BAD ({found.reason or 'no reason recorded'}): refusing to "
                              "restore it; force it (tandem restore --force) to restore it anyway")
    if found.status == PRUNED:
        raise SnapshotRefused(f"snapshot {found.id} was pruned ({found.reason or 'no reason recorded'}): "
                              "its files are gone")
    raise SnapshotRefused(f"snapshot {found.id} is still TAKING (or was abandoned while taken): it is incomplete")


def _latest_good(rows: list[SnapshotRecord]) -> SnapshotRecord:
    instances = sorted({f"{r.plan}/{r.instance}" for r in rows})
    if len(instances) > 1:
        raise SnapshotError(f"snapshots of several instances ({', '.join(instances)}): choose the latest good one per instance")
    goods = [r for r in rows if r.status == GOOD]
    if goods:
        return goods[0]
    if not rows:
        raise SnapshotError("no snapshot in the catalog: nothing to restore")
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row.status] += 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    raise SnapshotError(f"no GOOD snapshot of {instances[0]} ({summary}); a BAD one can be restored by id with force")
