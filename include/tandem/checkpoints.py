"""Streaming checkpoints on disk: a consistent cut at the last committed batch, copied elsewhere; its checks;
undoing a swap a crash interrupted; and the query id (lineage) in a checkpoint's ``metadata``.

Purpose
    A node that rejoins as PASSIVE, or a warm standby that takes over, must resume where another
    instance stands instead of reprocessing everything since its own (old or missing) checkpoint.
    :func:`cut_checkpoint` copies the part of one query's checkpoint that a restart at its last
    committed batch N needs into another instance's own checkpoint location (never shared); the
    supervisor's re-sync (:mod:`tandem.resync`) and the snapshots
    (:mod:`tandem.snapshots.take`) use it; the runtime recovers interrupted swaps before Spark reads
    a checkpoint. Below the runtime, the supervisor and the snapshots: it imports none of them.

How it works
    Spark writes, per micro-batch N: ``offsets/N`` (before the batch), the state store version N+1
    (``state/<op>/<partition>/<N+1>.delta`` and, now and then, ``.snapshot``), then ``commits/N``.
    The file source's own log (``sources/<i>/<k>``, compacted every 10 entries to ``<k>.compact``)
    is numbered independently; ``offsets/N`` names the entry ``k`` (``logOffset``) it had reached.
    Files are written once (by rename) and only deleted when old, so the cut works on a running
    query: it lists ``commits/`` first and picks the newest committed N, and from then on takes
    only ``commits/`` and ``offsets/`` ≤ N, source-log entries ≤ the ``logOffset`` of
    ``offsets/N``, and state files of versions ≤ N+1 (schema and operator metadata files, which
    are not versioned, as they are). Whatever a batch after N writes meanwhile is left out. The
    copy goes to a staging directory next to the target, is verified (commits/N, offsets/N and
    N-1, an unbroken source log up to its entry, a loadable state chain for version N+1 in every
    partition), then replaces the target with two renames. The target gets a fresh query id in
    ``metadata``: it is a new lineage of the query, so sinks that deduplicate per (query, batch)
    treat its batches N+1, N+2, … as new.

What it does not do
    It does not stop anything: the target's instance must not run while its checkpoint is
    replaced (the supervisor stops it first). It supports Spark's default HDFS-backed state store
    (checkpoint format v1); RocksDB's shared SST files are copied as they are.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.errors import TandemError

log = logging.getLogger(__name__)

_LOG_ENTRY = re.compile(r"^(\d+)(\.compact)?$")
_STATE_FILE = re.compile(r"^(\d+)(?:_[0-9A-Za-z-]+)?\.(delta|snapshot|zip|changelog)$")
_NUMBERED = re.compile(r"^(\d+)(?:_.*)?$")
_KNOWN = {"metadata", "offsets", "commits", "sources", "state"}


class CheckpointError(TandemError):
    """A checkpoint could not be cut: missing, or the cut failed verification."""


@dataclass(frozen=True)
class CutInfo:
    """The result of one cut: the batch it is at, how much was copied, and the target's query id.

    ``batch_id`` is ``None`` when the source had no committed batch: nothing was copied and the
    target was left as it was.
    """

    batch_id: int | None
    files: int
    bytes: int
    query_id: str | None = None
    skipped: tuple[str, ...] = field(default=(), repr=False)
    committed_at: float | None = None
    """When the batch was committed (its commit file's modification time, the storage's clock): batches replayed
    from the cut started after it."""


def committed_batch(query_dir: Path) -> int | None:
    """The newest batch id in ``commits/`` (``None`` when nothing was committed)."""
    return newest_log_entry(query_dir / "commits")


def newest_log_entry(directory: Path) -> int | None:
    """The newest batch id of a checkpoint's log (``offsets/``, ``commits/``), ``None`` when it has none."""
    ids = [int(m.group(1)) for m in (_LOG_ENTRY.match(p.name) for p in _entries(directory)) if m]
    return max(ids) if ids else None


def _entries(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if not p.name.startswith(".")]
    except FileNotFoundError:
        return []


def _source_lines(offsets_file: Path) -> list[str]:
    """The per-source lines of an ``offsets/N`` file (after its version and metadata lines)."""
    lines = offsets_file.read_text().splitlines()
    if not lines or not lines[0].startswith("v"):
        raise CheckpointError(f"{offsets_file}: not a Spark offset log entry")
    return lines[2:]


def _no_offset(line: str) -> bool:
    return line.strip() in ("", "-")


def _json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def committed_watermark_ms(query_dir: Path) -> int | None:
    """The event-time watermark (epoch milliseconds) the query's newest committed batch ran with; ``None`` when
    nothing was committed."""
    batch = committed_batch(query_dir)
    if batch is None:
        return None
    offsets_file = query_dir / "offsets" / str(batch)
    lines = offsets_file.read_text().splitlines() if offsets_file.is_file() else []
    metadata = _json_or_none(lines[1]) if len(lines) > 1 else None
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{offsets_file}: no batch metadata although batch {batch} committed")
    return int(metadata.get("batchWatermarkMs", 0))


def source_offsets(offsets_file: Path) -> list[Any]:
    """Per source of an ``offsets/N`` file, in the order of the query's sources: its offset as JSON (the end
    of batch N: where the query goes on from), or ``None`` when it had none yet (``-``) or it is not JSON."""
    return [None if _no_offset(line) else _json_or_none(line) for line in _source_lines(offsets_file)]


def source_log_offsets(offsets_file: Path) -> list[int | None]:
    """Per source of an ``offsets/N`` file: the file-source log entry it reached.

    -1 when the source had no offset yet (``-``), ``None`` when it is not a file source (its
    ``sources/<i>`` directory holds something else, e.g. Kafka's initial offsets, kept whole).
    """
    reached: list[int | None] = []
    for line in _source_lines(offsets_file):
        if _no_offset(line):
            reached.append(-1)
            continue
        offset = _json_or_none(line)
        reached.append(int(offset["logOffset"]) if isinstance(offset, dict) and "logOffset" in offset else None)
    return reached


def _wanted(source: Path, batch: int) -> tuple[list[Path], list[str]]:
    """Relative paths (without checksums) that a restart at ``batch`` needs; and unknown entries left out."""
    wanted: list[Path] = [Path("metadata")] if (source / "metadata").is_file() else []
    for log_dir in ("commits", "offsets"):
        for entry in _entries(source / log_dir):
            match = _LOG_ENTRY.match(entry.name)
            if match and int(match.group(1)) <= batch:
                wanted.append(entry.relative_to(source))
    if not (source / "offsets" / str(batch)).is_file():
        raise CheckpointError(f"{source}: batch {batch} is committed but its offsets file is missing")
    reached = source_log_offsets(source / "offsets" / str(batch))
    for source_log in _entries(source / "sources"):
        index = int(source_log.name) if source_log.name.isdigit() else None
        limit = reached[index] if index is not None and index < len(reached) else None
        for path in _files(source_log):
            match = _LOG_ENTRY.match(path.name)
            if limit is None or (match and int(match.group(1)) <= limit):
                wanted.append(path.relative_to(source))
    for path in _files(source / "state"):
        relative = path.relative_to(source)
        in_metadata = any(part.startswith("_") for part in relative.parts[:-1])
        versioned = (_NUMBERED if in_metadata else _STATE_FILE).match(path.name)
        if versioned is None or int(versioned.group(1)) <= (batch if in_metadata else batch + 1):
            wanted.append(relative)
    unknown = [p.name for p in _entries(source) if p.name not in _KNOWN]
    return wanted, unknown


def _files(directory: Path) -> list[Path]:
    """Every data file under ``directory`` (no checksums, no temporary files)."""
    found = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            if not name.startswith(".") and not name.endswith(".tmp"):
                found.append(Path(root) / name)
    return found


def _checksum(path: Path) -> Path:
    return path.with_name(f".{path.name}.crc")


def verify_cut(staged: Path, batch: int) -> None:
    """Raise :class:`CheckpointError` unless the checkpoint at ``staged`` restarts at batch ``batch``."""
    problems = []
    for needed in (f"commits/{batch}", f"offsets/{batch}", *([f"offsets/{batch - 1}"] if batch > 0 else [])):
        if not (staged / needed).is_file():
            problems.append(f"{needed} is missing")
    reached = source_log_offsets(staged / "offsets" / str(batch)) if (staged / "offsets" / str(batch)).is_file() else []
    for index, limit in enumerate(reached):
        if limit is not None:
            problems += _source_log_gaps(staged / "sources" / str(index), limit)
    for partition in {p.parent for p in _files(staged / "state") if _STATE_FILE.match(p.name)}:
        problems += _state_chain_gaps(partition, batch + 1)
    if problems:
        raise CheckpointError(f"the cut at batch {batch} is not restartable: {'; '.join(problems[:5])}")


def source_log_entries(log_dir: Path, limit: int) -> list[tuple[int, Path]]:
    """The entries of a file-source log numbered up to ``limit``, from the newest compacted one at or below it (it
    repeats every earlier entry), in order: (number, path)."""
    listed = sorted((int(match.group(1)), path) for path in _entries(log_dir)
                    if (match := _LOG_ENTRY.match(path.name)) and int(match.group(1)) <= limit)
    start = max((number for number, path in listed if path.name.endswith(".compact")), default=-1)
    return [(number, path) for number, path in listed if number >= start]


def _source_log_gaps(log_dir: Path, limit: int) -> list[str]:
    entries = source_log_entries(log_dir, limit)
    start = entries[0][0] + 1 if entries and entries[0][1].name.endswith(".compact") else 0
    present = {number for number, _ in entries}
    missing = [k for k in range(start, limit + 1) if k not in present]
    return [f"{log_dir.name} source log entries {missing[:3]} are missing"] if missing else []


def _state_chain_gaps(partition: Path, version: int) -> list[str]:
    """A state version loads from its newest snapshot at or below it plus every delta after that."""
    have: dict[int, set[str]] = {}
    for path in partition.iterdir():
        match = _STATE_FILE.match(path.name)
        if match:
            have.setdefault(int(match.group(1)), set()).add(match.group(2))
    for v in range(version, 0, -1):
        kinds = have.get(v, set())
        if "snapshot" in kinds or "zip" in kinds:
            return []
        if "delta" not in kinds and "changelog" not in kinds:
            return [f"state {partition.parent.name}/{partition.name} version {v} is missing"]
    return []


def cut_checkpoint(source_query_dir: Path | str, target_query_dir: Path | str, *,
                   new_query_id: bool = True) -> CutInfo:
    """Copy a consistent cut of one query's checkpoint at its last committed batch to another location.

    Safe while the source query runs. Replaces ``target_query_dir`` (which no running query may
    use). With ``new_query_id`` the target gets a fresh query id (a new lineage); otherwise the
    source's.

    Raises:
        CheckpointError: the source is missing, is the target, or the cut failed verification.
    """
    source, target = Path(source_query_dir), Path(target_query_dir)
    recover_swaps(target.parent)
    if not source.is_dir():
        raise CheckpointError(f"no checkpoint at {source}")
    if source.resolve() == target.resolve():
        raise CheckpointError(f"source and target are the same checkpoint: {source}")
    batch = committed_batch(source)
    if batch is None:
        return CutInfo(None, 0, 0)
    committed_at = (source / "commits" / str(batch)).stat().st_mtime

    wanted, unknown = _wanted(source, batch)
    if unknown:
        log.warning("cut of %s: left out unknown checkpoint entries %s", source, ", ".join(sorted(unknown)))
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.parent / f".{target.name}.cut-{uuid.uuid4().hex[:8]}"
    files = size = 0
    skipped: list[str] = []
    try:
        for relative in wanted:
            if relative == Path("metadata") and new_query_id:
                continue
            for path in (source / relative, _checksum(source / relative)):
                destination = staged / path.relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(path, destination)
                except FileNotFoundError:  # an old file Spark purged meanwhile; verify_cut checks what matters
                    if path.name == relative.name:
                        skipped.append(str(relative))
                    continue
                files += 1
                size += destination.stat().st_size
        query_id = _write_metadata(source, staged, new_query_id)
        if (staged / "metadata").is_file():
            files += 1
            size += (staged / "metadata").stat().st_size
        verify_cut(staged, batch)
        _replace(staged, target)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    log.info("cut %s at batch %d into %s: %d files, %d bytes", source, batch, target, files, size)
    return CutInfo(batch, files, size, query_id, tuple(skipped), committed_at)


def _write_metadata(source: Path, staged: Path, new_query_id: bool) -> str | None:
    try:
        metadata = json.loads((source / "metadata").read_text().splitlines()[0])
    except (FileNotFoundError, IndexError, json.JSONDecodeError):
        metadata = {}
    if new_query_id:
        metadata["id"] = str(uuid.uuid4())
    elif not metadata:
        return None
    (staged / "metadata").write_text(json.dumps(metadata, separators=(",", ":")) + "\n")
    return metadata.get("id")


def _replace(staged: Path, target: Path) -> None:
    """Swap ``staged`` in for ``target`` (two renames: a crash between them is undone by :func:`recover_swaps`)."""
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    if target.exists():
        target.rename(old)
    staged.rename(target)
    shutil.rmtree(old, ignore_errors=True)


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>old|cut)-[0-9a-f]{8}$")


def recover_swaps(root: Path) -> list[str]:
    """Undo what a crash in the middle of :func:`cut_checkpoint` left in ``root`` (an instance's checkpoint root).

    - ``.<query>.old-*`` with ``<query>`` missing: the crash came between the two renames of the
      swap; the old checkpoint is renamed back (consistent, only older than the cut meant to replace it);
    - ``.<query>.old-*`` beside ``<query>``: the swap completed; the old copy is deleted;
    - ``.<query>.cut-*``: an unfinished staging copy; deleted.

    Returns what was done, one line per leftover. Nothing may use the checkpoints meanwhile.
    """
    if not root.is_dir():
        return []
    done = []
    leftovers = sorted((p for p in root.iterdir() if _LEFTOVER.match(p.name)), key=lambda p: p.stat().st_mtime,
                       reverse=True)
    for path in leftovers:
        match = _LEFTOVER.match(path.name)
        target = root / match["name"]
        if match["kind"] == "old" and not target.exists():
            path.rename(target)
            done.append(f"{target.name}: restored from {path.name} (a swap was interrupted)")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"{target.name}: deleted the leftover {path.name}")
    for line in done:
        log.warning("checkpoints in %s: %s", root, line)
    return done


def query_dirs(instance_root: Path) -> dict[str, Path]:
    """The queries of an instance's checkpoint root (one directory per query)."""
    return {p.name: p for p in _entries(instance_root) if p.is_dir()}


GUARD_WINDOW_S = 600.0
"""A node's checkpoint guards landing files while its instance beat, or the checkpoint changed, this recently:
longer than a failed instance waits for its restart and a re-sync's copy for its driver's first beat
(:func:`tandem.snapshots.retention.guarding_nodes`)."""


def last_changed(instance_root: Path) -> float | None:
    """When an instance's checkpoint last changed (a batch's offsets or commit, a query or the root written), as a
    POSIX time; ``None`` when it has none. A re-sync writes new directories, so it counts as a change."""
    directories = [instance_root]
    for query in query_dirs(instance_root).values():
        directories += [query, query / "offsets", query / "commits"]
    times = []
    for directory in directories:
        try:
            times.append(directory.stat().st_mtime)
        except FileNotFoundError:
            pass
    return max(times, default=None)


def checkpoint_lineage(checkpoint: Path | None) -> str:
    """The query id in a checkpoint's ``metadata`` ('' when there is none yet)."""
    if checkpoint is None:
        return ""
    try:
        return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0]).get("id", ""))
    except (FileNotFoundError, IndexError, ValueError, AttributeError):
        return ""


# --- which files a query's file sources read ----------------------------------------------------------------------
#
# Spark's file source logs the files it picks for batch N in its own log (``sources/<i>/<k>``, compacted every few
# entries into ``<k>.compact``, which repeats every earlier entry) *before* batch N runs; ``offsets/N`` names the
# entry ``k`` (``logOffset``) the batch reached. A file is behind the query only once a batch that read it
# committed: a query that crashes before ``commits/N`` reruns batch N and reads its files again. So only the entries
# up to the ``logOffset`` of ``offsets/<last committed batch>`` count, not the whole log. Each entry file holds a
# version line (``v1``) and one JSON object per file, with its ``path`` (a ``file:`` URI). Files are listed by what
# the log says, not checked to exist. Landing retention (:func:`tandem.snapshots.retention.decide_landing_retention`)
# and a backfill's checks read them.


def processed_files(query_dir: Path | str, source_index: int = 0) -> frozenset[str]:
    """Paths (as logged, ``file:`` URIs) of the files source ``source_index`` read by the last committed batch.

    Empty when nothing was committed yet. Works on a live checkpoint and on a snapshot's cut.
    """
    query_dir = Path(query_dir)
    batch = committed_batch(query_dir)
    if batch is None:
        return frozenset()
    offsets_file = query_dir / "offsets" / str(batch)
    if not offsets_file.is_file():
        raise CheckpointError(f"{offsets_file} is missing although batch {batch} committed")
    reached = source_log_offsets(offsets_file)
    if source_index >= len(reached):
        raise CheckpointError(f"{offsets_file}: no source {source_index} (the query has {len(reached)})")
    limit = reached[source_index]
    if limit is None:
        raise CheckpointError(f"{offsets_file}: source {source_index} is not a file source")
    return _logged_up_to(query_dir / "sources" / str(source_index), limit)


def _logged_up_to(log_dir: Path, limit: int) -> frozenset[str]:
    """The paths a file-source log lists in its entries up to ``limit`` (compacted ones included)."""
    return frozenset(record["path"] for record in _records_up_to(log_dir, limit))


_LISTINGS = 5
"""How many times a log is listed before an entry that keeps disappearing is an error (see :func:`_records_up_to`)."""


def _records_up_to(log_dir: Path, limit: int) -> list[dict]:
    """The records (``path``, ``timestamp`` …) a file-source log holds in its entries up to ``limit``: those of the
    newest compacted entry at or below it (it repeats every earlier entry) and of the entries after it.

    Spark deletes the entries a compaction repeats while the query runs (older than
    ``spark.sql.streaming.fileSource.log.cleanupDelay``). An entry that goes between the listing and its reading
    is repeated by a newer compaction, so the log is listed again. (Reading every listed entry failed a soak's
    reconcile with ``FileNotFoundError`` after two hours of a running query.)
    """
    for _ in range(_LISTINGS):
        try:
            return [record for _, entry in source_log_entries(log_dir, limit) for record in _logged_records(entry)]
        except FileNotFoundError:
            continue
    raise CheckpointError(f"{log_dir}: its entries kept disappearing while they were read ({_LISTINGS} listings)")


def processed_files_by_source(query_dir: Path | str, batch: int | None = None) -> list[frozenset[str] | None]:
    """:func:`processed_files` of every source of the query (``None`` for a source that is not a file
    source), up to its last committed batch (or up to ``batch``, planned if not committed); empty when nothing was
    committed yet."""
    query_dir = Path(query_dir)
    batch = committed_batch(query_dir) if batch is None else batch
    if batch is None or not (query_dir / "offsets" / str(batch)).is_file():
        return []
    reached = source_log_offsets(query_dir / "offsets" / str(batch))
    return [None if limit is None else _logged_up_to(query_dir / "sources" / str(index), limit)
            for index, limit in enumerate(reached)]


def processed_file_times(query_dir: Path | str) -> dict[str, int]:
    """Every file any file source of the query read by its last committed batch: path (``file:`` URI) -> the file's
    modification time as logged (ms since the epoch); empty when nothing was committed yet."""
    query_dir = Path(query_dir)
    batch = committed_batch(query_dir)
    if batch is None or not (query_dir / "offsets" / str(batch)).is_file():
        return {}
    return {record["path"]: int(record.get("timestamp") or 0)
            for index, limit in enumerate(source_log_offsets(query_dir / "offsets" / str(batch))) if limit is not None
            for record in _records_up_to(query_dir / "sources" / str(index), limit)}


def _logged_records(entry: Path) -> list[dict]:
    lines = entry.read_text().splitlines()
    if not lines or not lines[0].startswith("v"):
        raise CheckpointError(f"{entry}: not a Spark file-source log entry")
    records = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record["path"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{entry}: line {number} is not a file-source log record") from None
        records.append(record)
    return records
