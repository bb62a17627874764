"""Upkeep of a Delta table under live appends: small files compacted, a checkpoint, and a vacuum that keeps every
version a kept snapshot needs.

Purpose
    Every micro-batch of every instance appends a few small files to each output table: a minute of the
    demo left 138 parquet files in 23 commits in the trades table, and every read (the page's quarantine
    panel, merge-on-read, a restore's time travel) lists and opens them all. Compaction rewrites them into
    few large files, a checkpoint spares readers replaying the JSON log, vacuum deletes the files no
    version still needed references, and a log cleanup deletes the commits before a checkpoint no kept
    version needs (one JSON per micro-batch otherwise accumulates for delta-rs's default 30 days).

How it works
    :func:`maintain_table` runs delta-rs's ``optimize.compact()``, ``create_checkpoint()`` and
    ``vacuum()`` on the newest version. The instances keep appending meanwhile: an append commits whatever
    a compaction does (delta-rs retries it), and a compaction that lost the race to an append fails with
    ``CommitFailedError`` and is tried again on the new version (:data:`tandem.lake.tables.ATTEMPTS`), so no append is lost and
    no batch is written twice (the appends' application transactions survive compaction). Vacuum never
    deletes a file of the versions in ``keep`` (the kept snapshots' versions of the table: a restore rolls
    an instance back to one of them by time travel) nor a file removed less than ``retention_s`` ago
    (a reader of an older version still at work), and never a file the log does not mention yet (an append
    in flight: the vacuum is not ``full``). delta-rs counts its retention in whole hours, so the retention
    is kept exactly by keeping, too, the version before each commit that removed files within it
    (:func:`versions_before_removals`): a file removed by commit ``r`` is one of version ``r - 1``'s.
    The log cleanup (:func:`expired_log_entries`) deletes the log entries of versions before the newest
    checkpoint at or below the oldest kept version (time travel to a kept version starts from that checkpoint),
    and only those older than ``log_retention_s`` (a reader loading an older version now); delta-rs's own
    ``cleanup_metadata`` knows no kept versions.

What it does not do
    Decide which versions are needed (:func:`kept_versions` from the snapshot catalog's records) or when to
    run (the maintenance DAG); PostgreSQL retention. Time travel to a version before the cleaned log fails
    (:func:`oldest_readable_version` says where it starts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from deltalake import DeltaTable

from tandem.lake.tables import retry_on_conflict


@dataclass(frozen=True)
class Upkeep:
    """What :func:`maintain_table` did to one table."""

    path: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    files_compacted: int
    files_written: int
    files_vacuumed: int
    kept_versions: tuple[int, ...]
    retries: int
    log_entries_removed: int = 0
    rows_expired: int = 0

    def describe(self) -> str:
        """One line for a task log."""
        return (f"{self.path}: {self.rows_expired} rows past their retention deleted, "
                f"{self.files_before} -> {self.files_after} data files (compacted {self.files_compacted} "
                f"into {self.files_written}), versions {self.version_before} -> {self.version_after}, checkpoint "
                f"written, {self.files_vacuumed} unreferenced files vacuumed (versions kept for snapshots: "
                f"{', '.join(map(str, self.kept_versions)) or 'none'}), {self.log_entries_removed} expired log "
                f"entries removed, {self.retries} retries after racing appends")


def kept_versions(recorded: Iterable[Mapping[str, int]], table: str, latest: int) -> tuple[int, ...]:
    """The versions of ``table`` that snapshots recorded (their ``output_versions``), oldest first, up to ``latest``
    (pure). A version after ``latest`` cannot exist; it is left out rather than passed to vacuum."""
    return tuple(sorted({int(versions[table]) for versions in recorded
                         if table in versions and 0 <= int(versions[table]) <= latest}))


APPEND_OPERATIONS = frozenset({"WRITE", "STREAMING UPDATE"})
"""Commits that only add files (a ``WRITE`` in another mode than ``Append`` may remove some; version 0, the
table's creation, has no version before it)."""


def versions_before_removals(history: Iterable[Mapping], since_ms: float) -> tuple[int, ...]:
    """The version before each commit at or after ``since_ms`` (ms since the epoch) that may have removed files
    (pure; ``history``: delta-rs's ``DeltaTable.history()`` entries). Keeping those versions keeps every file
    removed since then."""
    before = set()
    for commit in history:
        if commit.get("timestamp", 0) < since_ms or "version" not in commit or commit["version"] < 1:
            continue
        operation = commit.get("operation", "")
        mode = str((commit.get("operationParameters") or {}).get("mode", "Append"))
        if operation not in APPEND_OPERATIONS or mode not in ("Append", "ErrorIfExists"):
            before.add(int(commit["version"]) - 1)
    return tuple(sorted(before))


def log_version(name: str) -> int | None:
    """The version a ``_delta_log`` file belongs to (``00000000000000000042.json``, ``….checkpoint.parquet``,
    ``….crc``), ``None`` for any other file (``_last_checkpoint``, temporary files)."""
    head = name[:20]
    return int(head) if len(head) == 20 and head.isdigit() and name[20:21] == "." else None


def checkpoint_version(name: str) -> int | None:
    """The version a ``_delta_log`` checkpoint file holds (``….checkpoint.parquet``), ``None`` for any other file."""
    return log_version(name) if ".checkpoint." in name else None


def expired_log_entries(entries: Iterable[tuple[str, float]], floor: int, cutoff: float) -> list[str]:
    """The ``_delta_log`` files (name, modified at) a reader of any version from ``floor`` on no longer needs (pure).

    Those of versions before the newest checkpoint at or below ``floor``, modified before ``cutoff``. None
    without such a checkpoint (every version up to ``floor`` is then read from the commits before it).
    """
    entries = list(entries)
    checkpoints = [v for name, _ in entries if (v := checkpoint_version(name)) is not None and v <= floor]
    if not checkpoints:
        return []
    boundary = max(checkpoints)
    return sorted(name for name, modified in entries
                  if (v := log_version(name)) is not None and v < boundary and modified < cutoff)


def oldest_readable_version(path: Path) -> int:
    """The oldest version of the Delta table at ``path`` time travel can load: 0 while its log is whole, else the
    oldest checkpoint a log cleanup left."""
    names = [entry.name for entry in (path / "_delta_log").iterdir()]
    if any(log_version(name) == 0 and name.endswith(".json") for name in names):
        return 0
    return min((v for name in names if (v := checkpoint_version(name)) is not None), default=0)


def clean_log(path: Path, floor: int, log_retention_s: float, now: Callable[[], float] = time.time) -> int:
    """Delete the :func:`expired_log_entries` of the table at ``path``; how many."""
    log = path / "_delta_log"
    entries = [(entry.name, entry.stat().st_mtime) for entry in log.iterdir() if entry.is_file()]
    expired = expired_log_entries(entries, floor, now() - log_retention_s)
    for name in expired:
        (log / name).unlink(missing_ok=True)
    return len(expired)



def maintain_table(path: Path, *, keep: Sequence[int] = (), retention_s: float = 7 * 86400.0,
                   log_retention_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
                   now: Callable[[], float] = time.time, expire: tuple[str, datetime] | None = None) -> Upkeep:
    """Delete expired rows, compact, checkpoint, vacuum and clean the log of the Delta table at ``path`` while
    others append to it.

    ``keep``: versions whose files and log vacuum and log cleanup must keep (the kept snapshots');
    ``retention_s``: files removed more recently than this are kept too (default: Delta's own week);
    ``log_retention_s``: log entries modified more recently than this are kept (``None``: no log cleanup);
    ``expire``: ``(column, instant)``: rows whose timestamp ``column`` is before it are deleted first (their files
    go with the vacuum, once ``retention_s`` is past).
    """
    before = DeltaTable(str(path))
    version_before, files_before = before.version(), len(before.file_uris())
    expired, expire_retries = 0, 0
    if expire is not None:
        column, instant = expire
        deleted, expire_retries = retry_on_conflict(lambda: DeltaTable(str(path)).delete(
            f"{column} < '{instant.astimezone(timezone.utc).isoformat()}'"), sleep)
        expired = int(deleted.get("num_deleted_rows", 0))
    metrics, compact_retries = retry_on_conflict(lambda: DeltaTable(str(path)).optimize.compact(), sleep)
    checkpointed = DeltaTable(str(path))
    checkpointed.create_checkpoint()
    oldest = oldest_readable_version(path)  # a version whose log is gone has no reader left to protect
    recent = [v for v in versions_before_removals(checkpointed.history(), (now() - retention_s) * 1000)
              if v >= oldest]
    protected = sorted(set(keep) | set(recent))
    vacuumed, vacuum_retries = retry_on_conflict(lambda: DeltaTable(str(path)).vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False, keep_versions=protected), sleep)
    removed = 0 if log_retention_s is None else clean_log(path, min(protected, default=checkpointed.version()),
                                                          log_retention_s)
    after = DeltaTable(str(path))
    return Upkeep(str(path), version_before, after.version(), files_before, len(after.file_uris()),
                  int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0)), len(vacuumed),
                  tuple(keep), expire_retries + compact_retries + vacuum_retries, removed, expired)
