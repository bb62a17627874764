"""Load and validate ``conf/cluster.yaml`` and ``conf/plans/*.yaml``.

Every problem is reported as a :class:`~tandem.errors.ConfigError` that names the file and the
field. Environment variables override paths and URLs:

- ``TANDEM_HOME``: the project root, where ``jobs/`` and ``dist/`` are (default: the parent of
  the configuration folder; the configuration folder defaults to ``./conf``)
- ``TANDEM_CONF_DIR``: the configuration folder (default: ``$TANDEM_HOME/conf``)
- ``TANDEM_STORAGE_ROOT``: overrides ``storage_root``
- ``TANDEM_DATABASE_URL``: overrides ``database.url``
- ``TANDEM_AIRFLOW_URL``: overrides ``airflow.api_url``
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tandem.errors import ConfigError
from tandem.store.db import redact

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
CONN_ID_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
"""An Airflow connection id that makes a shell variable name (``AIRFLOW_CONN_<ID>``)."""
_UNITS = {
    0.001: ("ms", "millis", "millisecond", "milliseconds"),
    1.0: ("s", "sec", "secs", "second", "seconds"),
    60.0: ("m", "min", "mins", "minute", "minutes"),
    3600.0: ("h", "hour", "hours"),
    86400.0: ("d", "day", "days"),
}
_UNIT_SECONDS = {name: factor for factor, names in _UNITS.items() for name in names}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_duration(text: Any) -> float:
    """Parse ``"500 ms"``, ``"2 seconds"``, ``"1m"``, ``"1 day"`` or a bare number of seconds into seconds."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as '2 seconds', got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text).lower())
        if not match or (match.group(2) and match.group(2) not in _UNIT_SECONDS):
            raise ValueError(f"expected a duration such as '2 seconds', '500 ms' or '1 day', got {text!r}")
        number, unit = match.groups()
        seconds = float(number) * _UNIT_SECONDS.get(unit, 1.0)
    if seconds <= 0:
        raise ValueError(f"must be positive, got {text!r}")
    return seconds


def spark_interval(seconds: float) -> str:
    """Render seconds as an interval string Spark accepts (``"1500 milliseconds"``)."""
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis} milliseconds"
    return "1 second" if millis == 1000 else f"{millis // 1000} seconds"


@dataclass(frozen=True)
class NodeConfig:
    """A named place where plan instances run: a Spark master and an Airflow connection."""

    name: str
    spark_master: str
    airflow_conn_id: str
    driver_memory: str = "1g"


@dataclass(frozen=True)
class ClusterConfig:
    """``conf/cluster.yaml``: where data lives, the coordination database, and the nodes."""

    path: Path
    project_root: Path
    storage_root: Path
    database_url: str
    airflow_url: str
    nodes: dict[str, NodeConfig]

    @property
    def conf_dir(self) -> Path:
        return self.path.parent

    @property
    def spark_defaults(self) -> Path:
        return self.conf_dir / "spark-defaults.conf"

    def node(self, name: str) -> NodeConfig:
        try:
            return self.nodes[name]
        except KeyError:
            known = ", ".join(sorted(self.nodes))
            raise ConfigError(str(self.path), "nodes", f"unknown node {name!r} (known: {known})") from None


@dataclass(frozen=True)
class SourceConfig:
    """Where a plan's events land: ``<storage_root>/landing/<stream>/<shard_id>/``."""

    stream: str
    format: str = "jsonl"
    max_files_per_trigger: int = 1000


@dataclass(frozen=True)
class HeartbeatConfig:
    """Liveness heartbeat cadence; a node is presumed dead after ``interval × max_missed``."""

    interval_s: float = 1.0
    max_missed: int = 3

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.max_missed


@dataclass(frozen=True)
class ValidationConfig:
    """The batch DAG that validates a plan's serving table with Great Expectations."""

    schedule: str = "@hourly"
    lookback_s: float = 86400.0
    suite: str = ""


STANDBY_MODES = ("hot", "warm")


@dataclass(frozen=True)
class HAConfig:
    """High availability of a plan: how standbys wait, and when the supervisor calls an instance stuck.

    ``standby: hot`` runs the passive node's plan all the time (it takes over by itself);
    ``warm`` starts it only on failover, from a cut of the failed active's checkpoint.
    ``stall_timeout``: an instance that made no progress for this long while input waits is STALLED.
    ``launch_timeout``: how long a launched instance may take to send its first liveness beat.
    ``max_launches`` within ``launch_window``: how often the supervisor launches one node's
    instance before it gives up on it (a crash loop) until an operator restarts the node.
    """

    standby: str = "hot"
    stall_timeout_s: float = 30.0
    launch_timeout_s: float = 180.0
    max_launches: int = 5
    launch_window_s: float = 600.0


@dataclass(frozen=True)
class SnapshotConfig:
    """Scheduled persistence snapshots of a plan (the seeds' ``persistenceIntervalInMinutes``).

    ``interval``: how often the snapshot DAG takes a consistent cut of each shard's ACTIVE instance.
    ``keep``: how many GOOD snapshots per shard survive pruning (at least 1: the newest good one is
    never deleted). ``suite``: the Great Expectations suite (``conf/expectations/<suite>.json``)
    that validates a snapshot's exported state.
    """

    interval_s: float = 900.0
    keep: int = 3
    suite: str = ""


@dataclass(frozen=True)
class PlanConfig:
    """``conf/plans/<name>.yaml``: one streaming application and its policies."""

    path: Path
    name: str
    description: str
    module: str
    source: SourceConfig
    shards: tuple[str, ...]
    nodes: tuple[str, ...]
    trigger_interval_s: float
    watermark_s: float
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    ha: HAConfig = field(default_factory=HAConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)

    def check_shard(self, shard_id: str) -> str:
        """``shard_id`` if it is one of the plan's shards, else a :class:`ConfigError` naming the plan file."""
        if shard_id not in self.shards:
            raise ConfigError(str(self.path), "shards", f"{shard_id!r} is not a shard of plan {self.name} "
                                                        f"(shards: {', '.join(self.shards)})")
        return shard_id

    def check_node(self, node: str) -> str:
        """``node`` if it is one of the plan's nodes, else a :class:`ConfigError` naming the plan file."""
        if node not in self.nodes:
            raise ConfigError(str(self.path), "nodes", f"{node!r} is not a node of plan {self.name} "
                                                       f"(nodes: {', '.join(self.nodes)})")
        return node


def project_root() -> Path:
    return Path(os.environ.get("TANDEM_HOME") or os.getcwd()).resolve()


def conf_dir() -> Path:
    configured = os.environ.get("TANDEM_CONF_DIR")
    return Path(configured).resolve() if configured else project_root() / "conf"


class _Fields:
    """Typed access to one YAML mapping that reports problems as ``file: field: problem``."""

    def __init__(self, path: Path, data: Any, prefix: str = "") -> None:
        self.path = path
        self.prefix = prefix
        if not isinstance(data, dict):
            raise ConfigError(str(path), prefix or "(top level)", f"expected a mapping, got {type(data).__name__}")
        self.data = data

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(str(self.path), self.name(key), problem)

    def reject_unknown(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(str(key), f"unknown field (allowed: {', '.join(sorted(allowed))})")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., ) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.error(key, "is required")
            return default
        value = self.data[key]
        if isinstance(value, bool) and kind is not bool:
            raise self.error(key, f"expected {_kind_name(kind)}, got {value!r}")
        if not isinstance(value, kind):
            raise self.error(key, f"expected {_kind_name(kind)}, got {value!r}")
        return value

    def identifier(self, key: str, default: Any = ...) -> str:
        value = self.get(key, str, default)
        if not NAME_PATTERN.match(value):
            raise self.error(key, f"{value!r} must match {NAME_PATTERN.pattern}")
        return value

    def duration(self, key: str, default: Any = ...) -> float:
        value = self.get(key, (str, int, float), default)
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.error(key, str(exc)) from None

    def positive_int(self, key: str, default: Any = ...) -> int:
        value = self.get(key, int, default)
        if value <= 0:
            raise self.error(key, f"must be a positive integer, got {value!r}")
        return value

    def section(self, key: str) -> "_Fields":
        return _Fields(self.path, self.data.get(key) or {}, self.name(key))


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", dict: "a mapping", list: "a list", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(str(path), "", "file not found")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(unknown position)"
        raise ConfigError(str(path), where, f"invalid YAML: {getattr(exc, 'problem', exc)}") from None


def load_cluster(path: Path | None = None) -> ClusterConfig:
    """Load ``cluster.yaml`` (default ``$TANDEM_CONF_DIR/cluster.yaml``) with env overrides applied."""
    path = (path or conf_dir() / "cluster.yaml").resolve()
    top = _Fields(path, _read_yaml(path))
    top.reject_unknown({"storage_root", "database", "airflow", "nodes"})
    root = Path(os.environ["TANDEM_HOME"]).resolve() if os.environ.get("TANDEM_HOME") else path.parent.parent
    storage = Path(os.environ.get("TANDEM_STORAGE_ROOT") or top.get("storage_root", str, ".tandem/data"))
    database = top.section("database")
    database.reject_unknown({"url"})
    database_url = os.environ.get("TANDEM_DATABASE_URL") or database.get(
        "url", str, "postgresql://postgres@127.0.0.1:5432/tandem"
    )
    if not database_url.startswith(("postgresql://", "postgres://")):
        problem = f"expected a postgresql:// URL, got {redact(database_url)}"
        if os.environ.get("TANDEM_DATABASE_URL"):
            raise ConfigError("TANDEM_DATABASE_URL (environment)", "", problem)
        raise database.error("url", problem)
    airflow = top.section("airflow")
    airflow.reject_unknown({"api_url"})
    airflow_url = os.environ.get("TANDEM_AIRFLOW_URL") or airflow.get("api_url", str, "http://127.0.0.1:8080")

    raw_nodes = top.get("nodes", dict)
    if not raw_nodes:
        raise top.error("nodes", "must name at least one node")
    nodes: dict[str, NodeConfig] = {}
    for name in raw_nodes:
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise top.error(f"nodes.{name}", f"node name must match {NAME_PATTERN.pattern}")
        node = top.section("nodes").section(name)
        node.reject_unknown({"spark_master", "airflow_conn_id", "driver_memory"})
        conn_id = node.get("airflow_conn_id", str, "tandem_" + name.replace("-", "_"))
        if not CONN_ID_PATTERN.match(conn_id):
            raise node.error("airflow_conn_id", f"{conn_id!r} cannot name the variable AIRFLOW_CONN_{conn_id.upper()} "
                                                "that .tandem/env.sh exports: use letters, digits and _ "
                                                f"(e.g. {re.sub(r'[^A-Za-z0-9_]', '_', conn_id)[:64] or 'tandem_node'!r})")
        nodes[name] = NodeConfig(
            name=name,
            spark_master=node.get("spark_master", str),
            airflow_conn_id=conn_id,
            driver_memory=node.get("driver_memory", str, "1g"),
        )
    return ClusterConfig(
        path=path,
        project_root=root,
        storage_root=storage if storage.is_absolute() else (root / storage).resolve(),
        database_url=database_url,
        airflow_url=airflow_url.rstrip("/"),
        nodes=nodes,
    )


def load_plan(name_or_path: str | Path, cluster: ClusterConfig | None = None) -> PlanConfig:
    """Load one plan by name (``conf/plans/<name>.yaml``) or path, checked against the cluster."""
    cluster = cluster or load_cluster()
    candidate = Path(name_or_path)
    path = candidate if candidate.suffix in (".yaml", ".yml") else cluster.conf_dir / "plans" / f"{name_or_path}.yaml"
    path = path.resolve()
    top = _Fields(path, _read_yaml(path))
    top.reject_unknown(
        {"name", "description", "module", "source", "shards", "nodes", "trigger_interval", "watermark",
         "heartbeat", "validation", "ha", "snapshot"}
    )
    name = top.identifier("name")
    if path.stem != name:
        raise top.error("name", f"{name!r} must equal the file name {path.stem!r}")

    source = top.section("source")
    source.reject_unknown({"stream", "format", "max_files_per_trigger"})
    source_format = source.get("format", str, "jsonl")
    if source_format != "jsonl":
        raise source.error("format", f"only 'jsonl' is supported, got {source_format!r}")

    shards = tuple(top.get("shards", list))
    if not shards:
        raise top.error("shards", "must list at least one shard id")
    for index, shard in enumerate(shards):
        if not isinstance(shard, str) or not NAME_PATTERN.match(shard):
            raise top.error(f"shards[{index}]", f"{shard!r} must match {NAME_PATTERN.pattern}")
    if len(set(shards)) != len(shards):
        raise top.error("shards", "shard ids must be unique")

    nodes = tuple(top.get("nodes", list))
    for index, node in enumerate(nodes):
        if node not in cluster.nodes:
            raise top.error(f"nodes[{index}]", f"unknown node {node!r} (cluster.yaml defines {', '.join(cluster.nodes)})")
    if not nodes:
        raise top.error("nodes", "must list at least one node")

    heartbeat = top.section("heartbeat")
    heartbeat.reject_unknown({"interval", "max_missed"})
    validation = top.section("validation")
    validation.reject_unknown({"schedule", "lookback", "suite"})
    ha = top.section("ha")
    ha.reject_unknown({"standby", "stall_timeout", "launch_timeout", "max_launches", "launch_window"})
    standby = ha.get("standby", str, "hot")
    if standby not in STANDBY_MODES:
        raise ha.error("standby", f"expected one of {', '.join(STANDBY_MODES)}, got {standby!r}")
    snapshot = top.section("snapshot")
    snapshot.reject_unknown({"interval", "keep", "suite"})
    return PlanConfig(
        path=path,
        name=name,
        description=top.get("description", str, ""),
        module=top.get("module", str, f"tandem.plans.{name}"),
        source=SourceConfig(
            stream=source.identifier("stream", name),
            format=source_format,
            max_files_per_trigger=source.positive_int("max_files_per_trigger", 1000),
        ),
        shards=shards,
        nodes=nodes,
        trigger_interval_s=top.duration("trigger_interval", "1 second"),
        watermark_s=top.duration("watermark", "10 seconds"),
        heartbeat=HeartbeatConfig(
            interval_s=heartbeat.duration("interval", "1 second"),
            max_missed=heartbeat.positive_int("max_missed", 3),
        ),
        validation=ValidationConfig(
            schedule=validation.get("schedule", str, "@hourly"),
            lookback_s=validation.duration("lookback", "1 day"),
            suite=validation.get("suite", str, f"{name}_aggregates"),
        ),
        ha=HAConfig(
            standby=standby,
            stall_timeout_s=ha.duration("stall_timeout", "30 seconds"),
            launch_timeout_s=ha.duration("launch_timeout", "3 minutes"),
            max_launches=ha.positive_int("max_launches", 5),
            launch_window_s=ha.duration("launch_window", "10 minutes"),
        ),
        snapshot=SnapshotConfig(
            interval_s=snapshot.duration("interval", "15 minutes"),
            keep=snapshot.positive_int("keep", 3),
            suite=snapshot.get("suite", str, f"{name}_state"),
        ),
    )


def load_plans(cluster: ClusterConfig | None = None) -> dict[str, PlanConfig]:
    """Every plan in ``conf/plans/``, by name."""
    cluster = cluster or load_cluster()
    return {path.stem: load_plan(path, cluster) for path in sorted((cluster.conf_dir / "plans").glob("*.yaml"))}
