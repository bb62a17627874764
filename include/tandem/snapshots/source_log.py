"""Which landing files a query had read by its last committed batch, from its file-source log.

Purpose
    Landing retention (:func:`tandem.snapshots.retention.decide_landing_retention`) needs, per
    running query and per kept snapshot cut, the set of input files that are behind it for good.
    :func:`processed_files` reads that set from a query checkpoint or a snapshot's cut of one.

How it works
    Spark's file source logs the files it picks for batch N in its own log (``sources/<i>/<k>``,
    compacted every few entries into ``<k>.compact``, which repeats every earlier entry) *before*
    batch N runs; ``offsets/N`` names the entry ``k`` (``logOffset``) the batch reached. A file is
    behind the query only once a batch that read it committed: a query that crashes before
    ``commits/N`` reruns batch N and reads its files again. So only the entries up to the
    ``logOffset`` of ``offsets/<last committed batch>`` count, not the whole log. Each entry file
    holds a version line (``v1``) and one JSON object per file, with its ``path`` (a ``file:``
    URI).

What it does not do
    It lists files by what the log says; it does not check that they still exist. It supports the
    file source only (a Kafka source has no such log: :class:`~tandem.checkpoints.CheckpointError`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tandem.checkpoints import CheckpointError, committed_batch, source_log_entries, source_log_offsets


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


def processed_files_by_source(query_dir: Path | str) -> list[frozenset[str] | None]:
    """:func:`processed_files` of every source of the query (``None`` for a source that is not a file
    source); empty when nothing was committed yet."""
    query_dir = Path(query_dir)
    batch = committed_batch(query_dir)
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
