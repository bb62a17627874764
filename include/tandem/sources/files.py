"""The ``files`` source kind: JSON-lines files renamed into the landing folders of a stream's partitions,
``landing/<stream>/<partition>/`` (read by Spark's file source: :mod:`tandem.sources.files_reader`).

A producer writes a file under a hidden temporary name (Spark's file source ignores names starting with ``.``) and
renames it into place, so readers never see half a file. Landing retention moves files every reader has processed
to ``retained/<stream>/<partition>/``, where a backfill still finds them; which files a query processed is in its
checkpoint's file-source log (:func:`tandem.checkpoints.processed_file_times`).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from tandem.checkpoints import processed_file_times, query_dirs
from tandem.declarations import SOURCE_RULES, StreamConfig
from tandem.errors import BackfillRefused, PathOutsideRoot
from tandem.layout import (
    checkpoint_dir,
    input_files,
    input_mtimes,
    landing_dir,
    make_private_dirs,
    retained_dir,
    retained_twin,
)
from tandem.sources.base import UNBOUNDED, SourceKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tandem.config import ClusterConfig, PlanConfig

LISTED = 5
"""How many missing files a backfill's refusal names."""


def write_atomically(directory: Path, lines: Sequence[str], prefix: str = "events") -> Path:
    """Write ``lines`` as one new ``.jsonl`` file in ``directory``, atomically (temp file + rename); the folders it
    creates are private (0700)."""
    make_private_dirs(directory)
    name = f"{prefix}-{time.time_ns()}-{uuid.uuid4().hex[:8]}.jsonl"
    temporary = directory / f".{name}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    final = directory / name
    os.rename(temporary, final)
    return final


def missing_input(processed: Mapping[str, int], start: datetime, exists: Callable[[Path], bool]) -> list[Path]:
    """The files an instance read (``processed``: URI -> modification time in ms) that may hold events at or after
    ``start`` (modified then or later) and no longer exist, oldest first."""
    since_ms = start.timestamp() * 1000
    gone = [(mtime, Path(unquote(urlsplit(uri).path))) for uri, mtime in processed.items() if mtime >= since_ms]
    return [path for _, path in sorted(gone) if not exists(path)]


def still_retained(cluster: ClusterConfig, landing_file: Path) -> bool:
    """Whether an input file is still where it landed, or where landing retention moves it (``retained/``)."""
    if landing_file.exists():
        return True
    try:
        return retained_twin(cluster, landing_file).exists()
    except PathOutsideRoot:  # not a landing file of this storage root: it was where it was read, or nowhere
        return False


def of_stream(uri: str, stream: str) -> bool:
    """Whether a processed file (a ``file:`` URI) is one of ``stream``'s: ``.../<stream>/<partition>/<name>``."""
    return Path(unquote(urlsplit(uri).path)).parent.parent.name == stream


def _link_either(sources: tuple[Path, ...], target: Path) -> None:
    for source in sources:
        try:
            os.link(source, target)
            return
        except FileNotFoundError:
            continue
        except OSError:  # another file system (a symbolic link under the root): copy, keeping the modification time
            if source.exists():
                shutil.copy2(source, target)
                return
    raise BackfillRefused(f"input file {sources[0].name} disappeared while the recomputation gathered it (deleted "
                          f"from {' and '.join(str(s.parent) for s in sources)} by landing retention): run it again")


class FilesWriter:
    """A producer's files: one written atomically per call, in the partition's landing folder."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster

    def write(self, stream: str, partition: int, lines: Sequence[str], ids: Sequence[str] | None = None) -> str:
        return str(write_atomically(landing_dir(self.cluster, stream, partition), lines))

    def close(self) -> None:
        """Nothing is held open."""


class Files(SourceKind):
    name = "files"
    rules = SOURCE_RULES[name]

    def lines(self, spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
              folders: list[Path] | None = None) -> DataFrame:
        from tandem.sources.files_reader import landing_lines

        if folders is None:
            folders = [landing_dir(cluster, stream, p) for p in self.landing_partitions(plan, instance, stream)]
        return landing_lines(spark, folders, plan.streams[stream].max_files_per_trigger)

    def landing_partitions(self, plan: PlanConfig, instance: str, stream: str) -> list[int]:
        return plan.partitions(instance, stream)

    def writer(self, cluster: ClusterConfig, plan: PlanConfig) -> FilesWriter:
        return FilesWriter(cluster)

    def pending_arrivals(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
                         query_dir: Path) -> list[int]:
        """When each landing file of the instance's share of ``stream`` the query did not process was written."""
        processed = {Path(unquote(urlsplit(uri).path)) for uri in processed_file_times(query_dir)}
        return [int(mtime * 1000) for p in self.landing_partitions(plan, instance, stream)
                for path, mtime in input_mtimes(landing_dir(cluster, stream, p)).items() if path not in processed]

    def backfill_refusal(self, cluster: ClusterConfig, plan: PlanConfig, instances: list[str], stream: str,
                         start: datetime) -> str | None:
        """Files of ``stream`` an instance read that may hold events at or after ``start`` and are no longer retained
        (in ``landing/`` or ``retained/``)."""
        for instance in instances:
            processed: dict[str, int] = {}
            for node in plan.nodes:
                for query_dir in query_dirs(checkpoint_dir(cluster, plan.name, instance, node)).values():
                    processed.update({uri: mtime for uri, mtime in processed_file_times(query_dir).items()
                                      if of_stream(uri, stream)})
            gone = missing_input(processed, start, lambda path: still_retained(cluster, path))
            if gone:
                return (f"{len(gone)} input file(s) of instance {instance} that may hold events of the range are no "
                        f"longer retained: {', '.join(map(str, gone[:LISTED]))}"
                        + (f" and {len(gone) - LISTED} more" if len(gone) > LISTED else ""))
        return None

    def gather(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
               folder: Path) -> list[Path]:
        """Every file of the instance's share of ``stream`` still retained (``landing/`` and ``retained/``), linked into
        ``folder/<stream>/<partition>/``. A recomputation reads this one set: landing retention may move a file from
        one place to the other meanwhile, and a file read in both places (or in neither) would count twice (or not at
        all). Landing is listed first, so a file moved in between is found."""
        gathered = []
        for partition in self.landing_partitions(plan, instance, stream):
            landing, retained = landing_dir(cluster, stream, partition), retained_dir(cluster, stream, partition)
            names = sorted({path.name for path in (*input_files(landing), *input_files(retained))})
            target = folder / stream / str(partition)
            target.mkdir(parents=True, exist_ok=True)
            for name in names:
                _link_either((landing / name, retained / name), target / name)
            gathered.append(target)
        return gathered

    def unbounded(self, config: StreamConfig) -> StreamConfig:
        return config.model_copy(update={"max_files_per_trigger": UNBOUNDED})


KIND = Files()
