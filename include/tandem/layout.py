"""The storage layout under ``storage_root`` (see DESIGN.md): one function per kind of place.

Every place is built from names (plan, stream, instance, node, query, table, snapshot id), and a name
is one folder: ``..``, ``.``, an empty name or one with a path separator is refused
(:class:`~tandem.errors.PathOutsideRoot`), so no place built here lies outside the storage root.
A path read back from somewhere else (e.g. a snapshot's recorded ``checkpoint_path``) is data,
not trusted: :func:`under_root` checks it before anything reads, writes or deletes there. The
check is lexical: a symbolic link an operator put inside the root (another disk) is followed.

Every folder Tandem creates for its data is its owner's only (0700, :func:`make_private_dirs`): the
storage root when Tandem makes it, and the folders under it (:func:`prepare_storage_root` at each
launch), so what lies below them is private whoever creates it later (Spark, delta-rs). A folder
that already exists — a storage root an operator mounted or made — keeps its mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.errors import PathOutsideRoot

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig


PRIVATE_DIR_MODE = 0o700
STORAGE_FOLDERS = ("landing", "retained", "checkpoints", "delta", "snapshots", "backfills", "logs")
"""The storage root's folders, one per kind of place below."""


def make_private_dirs(path: Path) -> Path:
    """``path`` and its missing parents, each folder created here readable by its owner only (0700).

    Folders that exist keep their mode: they are not Tandem's to change (a storage root an operator made).
    """
    path = Path(path)
    missing = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)  # the umask only takes bits away: 0700 or less
        except FileExistsError:  # made meanwhile by another process: its mode is its own
            pass
    return path


def prepare_storage_root(cluster: ClusterConfig) -> None:
    """The storage root and its :data:`STORAGE_FOLDERS`, those that are missing created private (0700)."""
    for name in STORAGE_FOLDERS:
        make_private_dirs(_place(cluster, name))


def place_under(base: Path, *names: str, what: str) -> Path:
    """``base/<name>/…``, each name one folder (refused otherwise, naming ``what`` the base is)."""
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise PathOutsideRoot(f"{name!r} cannot name a folder under {what} {base}")
    return base.joinpath(*names)


def _place(cluster: ClusterConfig, *names: str) -> Path:
    return place_under(cluster.storage_root, *names, what="the storage root")


def under_root(cluster: ClusterConfig, path: Path | str) -> Path:
    """``path`` if it lies under the storage root (after ``..`` are resolved lexically), else :class:`PathOutsideRoot`."""
    root = os.path.normpath(os.path.abspath(cluster.storage_root))
    normal = os.path.normpath(os.path.abspath(path))
    if normal != root and not normal.startswith(root + os.sep):
        raise PathOutsideRoot(f"{path} is outside the storage root {root}: refusing to use it")
    return Path(path)


def landing_dir(cluster: ClusterConfig, stream: str, partition: int) -> Path:
    """Input files of one partition of a stream: ``landing/<stream>/<partition>/`` (docs/partitions.md)."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise PathOutsideRoot(f"{partition!r} is not a partition number (0, 1, ...)")
    return _place(cluster, "landing", stream, str(partition))


def _is_input(entry: os.DirEntry) -> bool:
    """A file of a landing or retained folder that is input: hidden and ``_`` files (a producer's names while it
    writes, which Spark skips too) are not."""
    return not entry.name.startswith((".", "_")) and entry.is_file()


def input_files(directory: Path) -> list[Path]:
    """The input files of a landing or retained folder (:func:`_is_input`), sorted; none when the folder does not
    exist."""
    try:
        with os.scandir(directory) as entries:
            return sorted(Path(e.path) for e in entries if _is_input(e))
    except FileNotFoundError:
        return []


def input_mtimes(directory: Path) -> dict[Path, float]:
    """The modification time of each input file of a landing or retained folder (as :func:`input_files` selects
    them, in their order); a file that moves away while the folder is read (landing retention retires it) is left
    out, not an error."""
    return {directory / name: mtime for name, mtime in sorted(InputMtimes().of(directory).items())}


class InputMtimes:
    """Input files' modification times by folder, remembered between reads: a read lists the folder and stats only
    the files it has not seen before (by name and inode, so a file written again under the same name is new). An
    input file does not change once it is visible (a producer writes a hidden or ``_`` name and renames it, which
    Spark's file source assumes too). For pollers: the supervision trigger reads every landing folder of its plan
    each second, and stat-ing thousands of files each time cost a fifth of a core."""

    def __init__(self) -> None:
        self._known: dict[Path, dict[str, tuple[int, float]]] = {}

    def of(self, directory: Path) -> dict[str, float]:
        """The folder's input files (by name) and their modification times; none when the folder does not exist."""
        known = self._known.get(directory, {})
        current: dict[str, tuple[int, float]] = {}
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not _is_input(entry):
                        continue
                    seen = known.get(entry.name)
                    if seen is None or seen[0] != entry.inode():
                        try:
                            seen = (entry.inode(), entry.stat().st_mtime)
                        except FileNotFoundError:  # retired by landing retention while the folder was read
                            continue
                    current[entry.name] = seen
        except FileNotFoundError:
            pass
        self._known[directory] = current
        return {name: mtime for name, (_, mtime) in current.items()}


def retained_dir(cluster: ClusterConfig, stream: str, partition: int) -> Path:
    """Input files of one partition that every reader has processed, kept for backfills and reconciles until
    ``maintenance.keep_input``: ``retained/<stream>/<partition>/``. Out of ``landing/``, so a stream's listing of its
    folder each trigger costs what is unprocessed, not what is retained."""
    return _place(cluster, "retained", *landing_dir(cluster, stream, partition).parts[-2:])


def retained_twin(cluster: ClusterConfig, landing_file: Path) -> Path:
    """Where landing retention moves ``landing/<stream>/<partition>/<name>``: ``retained/<stream>/<partition>/<name>``."""
    stream, partition, name = under_root(cluster, landing_file).parts[-3:]
    if not partition.isdigit() or landing_dir(cluster, stream, int(partition)) != Path(landing_file).parent:
        raise PathOutsideRoot(f"{landing_file} is not a file of a landing folder (<root>/landing/<stream>/<partition>)")
    return retained_dir(cluster, stream, int(partition)) / name


def instance_landing_dir(cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str | None = None) -> Path:
    """The first landing folder of an instance's share of ``stream``, a ``files`` stream (default: the plan's first
    stream).

    Events written there reach that instance (and no other instance of its group).
    """
    stream = stream or next(iter(plan.streams))
    return landing_dir(cluster, stream, plan.partitions(instance, stream)[0])


def checkpoint_dir(cluster: ClusterConfig, plan: str, instance: str, node: str, query: str = "") -> Path:
    """One query's checkpoint, never shared: ``checkpoints/<plan>/<instance>/<node>/<query>/``.

    Without ``query``: the instance's checkpoint root (one folder per query).
    """
    return _place(cluster, "checkpoints", plan, instance, node, *([query] if query else []))


def cut_file(cluster: ClusterConfig, plan: str, group: str) -> Path:
    """A group's newest cut-over (:mod:`tandem.cutover`): ``cuts/<plan>/<group>.json``."""
    return _place(cluster, "cuts", plan, f"{group}.json")


def retired_checkpoints_dir(cluster: ClusterConfig, plan: str, generation: int) -> Path:
    """Where a cut-over moves the checkpoints it retires: ``checkpoints/<plan>/_retired/<generation>/`` (a folder
    no instance reads: kept for an inquiry, removed with the plan)."""
    return _place(cluster, "checkpoints", plan, "_retired", str(generation))


def delta_table_dir(cluster: ClusterConfig, plan: str, table: str) -> Path:
    """A Delta table of a plan: ``delta/<plan>/<table>/``."""
    return _place(cluster, "delta", plan, table)


def snapshots_dir(cluster: ClusterConfig, plan: str) -> Path:
    """Where a plan's snapshot copies live: ``snapshots/<plan>/``."""
    return _place(cluster, "snapshots", plan)


def snapshot_dir(cluster: ClusterConfig, plan: str, snapshot_id: str) -> Path:
    """One snapshot's checkpoint cut: ``snapshots/<plan>/<id>/``."""
    return _place(cluster, "snapshots", plan, snapshot_id)


def backfill_dir(cluster: ClusterConfig, plan: str, backfill_id: str) -> Path:
    """A backfill's scratch space (its queries' checkpoints and recomputed rows): ``backfills/<plan>/<id>/``."""
    return _place(cluster, "backfills", plan, backfill_id)


def logs_dir(cluster: ClusterConfig, plan: str, instance: str) -> Path:
    """Where the driver logs of one instance go (every node's): ``logs/<plan>/<instance>/``."""
    return _place(cluster, "logs", plan, instance)


def plan_dirs(cluster: ClusterConfig, plan: str) -> dict[str, Path]:
    """Every folder that holds a plan's own data, by kind of place: ``checkpoints/<plan>/`` (every instance's and
    node's, with the plan's shape beside them), ``delta/<plan>/`` (outputs, partials, quarantine, state export),
    ``snapshots/<plan>/``, ``backfills/<plan>/`` and ``cuts/<plan>/`` (its groups' cut-overs). Input
    (``landing/``, ``retained/``: by stream, other plans may read it) and driver logs are not the plan's state."""
    return {name: _place(cluster, name, plan) for name in ("checkpoints", "delta", "snapshots", "backfills", "cuts")}
