"""Load and validate ``conf/cluster.yaml`` and ``conf/plans/*.yaml``.

The files are validated by pydantic models of their exact shape (``ClusterFile``, ``PlanFile``:
unknown fields refused, strict types, finite numbers, unique lists, cron schedules, memory sizes,
URLs, named suites that exist); ``tandem config schema`` prints their JSON Schema. YAML itself is read
strictly too: UTF-8 only, and a key given twice is an error (YAML would let the later one win).

Every problem is one :class:`~tandem.errors.ConfigError` line that names the file and the dotted
field (``conf/plans/trades.yaml: heartbeat.max_missed: must be a positive integer, got 0``); a
value that came from an environment variable is reported as that variable's. Environment
variables override paths and URLs:

- ``TANDEM_HOME``: the project root, where ``jobs/`` and ``dist/`` are (default: the parent of
  the configuration folder; the configuration folder defaults to ``./conf``)
- ``TANDEM_CONF_DIR``: the configuration folder (default: ``$TANDEM_HOME/conf``)
- ``TANDEM_STORAGE_ROOT``: overrides ``storage_root``
- ``TANDEM_PLANS_DIR``: the folder of the plans' files, ``<name>.yaml`` and ``<name>.py`` (default:
  ``$TANDEM_CONF_DIR/plans``; relative to the current folder when relative, as ``TANDEM_CONF_DIR``)
- ``TANDEM_DATABASE_URL``: overrides ``database.url``
- ``TANDEM_AIRFLOW_URL``: overrides ``airflow.api_url``
- ``TANDEM_SCRATCH_DIR``: the host-local folder of the drivers' temporary files, relative to the project
  root when relative (default: ``<temp dir>/tandem-<digest of the storage root>``; see
  :attr:`ClusterConfig.scratch_root`)
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import re
import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from tandem.declarations import (
    NOT_RESERVED,
    Duration,
    FieldName,
    GroupConfig,
    OutputConfig,
    StreamConfig,
    StrictModel,
    instance_ids,
    instance_partitions,
    matching,
    sources_where,
)
from tandem.errors import ConfigError, ConfigProblems
from tandem.names import QUARANTINE, QUARANTINE_QUERY
from tandem.redaction import redact, redact_url

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
INBOX_PATTERN = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,7}$")
CONN_ID_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
"""An Airflow connection id that makes a shell variable name (``AIRFLOW_CONN_<ID>``)."""
SUITE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,127}$")
MODULE_PATTERN = re.compile(r"^tandem\.plans\.[a-z_][a-z0-9_]*$")
MEMORY_PATTERN = re.compile(r"^[1-9][0-9]*[kmgt]?b?$", re.IGNORECASE)
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""An Airflow queue a node's host worker serves (``airflow edge worker --queues <queue>``)."""
SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@annually",
                    "@midnight")
def spark_interval(seconds: float) -> str:
    """Render seconds as an interval string Spark accepts (``"1500 milliseconds"``)."""
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis} milliseconds"
    return "1 second" if millis == 1000 else f"{millis // 1000} seconds"



# --- value types: each validates one kind of YAML value and says what is wrong with it ------------------


def _unique(values: list[str]) -> list[str]:
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"must be unique: {', '.join(twice)} listed more than once")
    return values


def _cron(value: str) -> str:
    from croniter import croniter

    if value not in SCHEDULE_PRESETS and not croniter.is_valid(value):
        raise ValueError(f"{value[:80]!r} is neither a cron expression ('0 * * * *') nor one of "
                         f"{', '.join(SCHEDULE_PRESETS)}")
    return value


MANUAL_SCHEDULE = "manual"


def _cron_or_manual(value: str) -> str:
    if value == MANUAL_SCHEDULE:
        return value
    try:
        return _cron(value)
    except ValueError as exc:
        raise ValueError(f"{exc}, nor {MANUAL_SCHEDULE!r} (triggered runs only)") from None


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s):// URL with a host, got {value[:80]!r}")
    return value.rstrip("/")


def _postgresql_url(value: str) -> str:
    if not value.startswith(("postgresql://", "postgres://")):
        raise ValueError(f"expected a postgresql:// URL, got {redact(value)}")
    return value


def _conn_id(value: str) -> str:
    if not CONN_ID_PATTERN.fullmatch(value):
        suggestion = re.sub(r"[^A-Za-z0-9_]", "_", value)[:64].lstrip("0123456789") or "tandem_node"
        raise ValueError(f"{value[:80]!r} cannot name the variable {'AIRFLOW_CONN_' + value.upper()[:80]!r} that "
                         f".tandem/env.sh exports: use letters, digits and _ (e.g. {suggestion!r})")
    return value


def _storage_root(value: str) -> str:
    if not value.strip() or "\0" in value or os.path.normpath(value) in ("/", "//"):
        raise ValueError(f"{value!r} cannot be the storage root (Tandem creates and deletes folders under it)")
    return value


Name = Annotated[StrictStr, matching(NAME_PATTERN, "lower-case letters, digits, - and _, at most 63"), NOT_RESERVED]
Names = Annotated[list[Name], Field(min_length=1), AfterValidator(_unique)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
SuiteName = Annotated[StrictStr, matching(SUITE_PATTERN, "a file name in conf/expectations/, without .json")]


# --- plan sections (used by the running code as they are) ------------------------------------------------


class HeartbeatConfig(StrictModel):
    """Liveness heartbeat cadence; a node is presumed dead after ``interval × max_missed``."""

    interval_s: Duration = Field(1.0, alias="interval")
    max_missed: PositiveInt = 3

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.max_missed


class ValidationConfig(StrictModel):
    """The batch DAG that validates a plan's outputs with Great Expectations.

    ``suite``: the suite file ``conf/expectations/<suite>.json`` (it must exist when named). Not named:
    ``<plan>_outputs.json`` or else ``<plan>_aggregates.json`` if there is one, else ``None`` once the
    plan is loaded: the suite implied by the outputs' declarations (:mod:`tandem.quality.implied`).
    """

    schedule: Annotated[StrictStr, AfterValidator(_cron)] = "@hourly"
    lookback_s: Duration = Field(86400.0, alias="lookback")
    suite: SuiteName | None = None


class HAConfig(StrictModel):
    """High availability of a plan: how standbys wait, and when the supervisor calls an instance stuck.

    ``standby: hot`` runs the passive node's plan all the time (it takes over by itself);
    ``warm`` keeps a standby running with its Spark session built and its queries not started: it
    takes over by itself and starts them from a cut of the failed active's checkpoint; ``cold``
    runs no standby: the supervisor starts the plan on another node on failover, from such a cut.
    ``stall_timeout``: an instance that made no progress for this long while input waits is STALLED.
    ``launch_timeout``: how long a launched instance may take to send its first liveness beat.
    ``max_launches`` within ``launch_window``: how often the supervisor launches one node's
    instance before it gives up on it (a crash loop) until an operator restarts the node.
    """

    standby: Literal["hot", "warm", "cold"] = "hot"
    stall_timeout_s: Duration = Field(30.0, alias="stall_timeout")
    launch_timeout_s: Duration = Field(180.0, alias="launch_timeout")
    max_launches: PositiveInt = 5
    launch_window_s: Duration = Field(600.0, alias="launch_window")


class SnapshotConfig(StrictModel):
    """Scheduled persistence snapshots of a plan (the seeds' ``persistenceIntervalInMinutes``).

    ``interval``: how often the snapshot DAG takes a consistent cut of each instance's ACTIVE node.
    ``keep``: how many GOOD snapshots per instance survive pruning (at least 1: the newest good one is
    never deleted). ``suite``: the Great Expectations suite (``conf/expectations/<suite>.json``)
    that validates a snapshot's exported state (not named: ``<plan>_state.json`` if there is one,
    else ``None`` once the plan is loaded: the generic state suite of :mod:`tandem.quality.implied`).
    """

    interval_s: Duration = Field(900.0, alias="interval")
    keep: PositiveInt = 3
    suite: SuiteName | None = None


Granularity = Literal["second", "minute", "hour", "day", "month", "year"]


class RetentionConfig(StrictModel):
    """How long PostgreSQL keeps a plan's rows before its maintenance DAG deletes them (:mod:`tandem.batch.trim`).

    ``partials``: per granularity, how old (by bucket start) an aggregation's partials may get; a granularity
    not named is kept for good (default: seconds for two days, coarser buckets for good). ``heartbeats``: the
    per-batch progress rows. ``publish_log``: the published positions. ``contributions``: the ids that make a
    table's or a fact aggregation's rows apply once (never one a kept snapshot's replay may bring again).
    ``failover_events``: supervision and role events. The newest row of each kind that something still reads
    (an instance's last progress, last published batch and furthest position, each node's last event of each
    kind) is kept whatever its age. ``events``: an events output's rows in PostgreSQL, by when they were
    published, once in the lake and (published to a NATS stream) relayed; the Delta copy keeps them.
    ``table_rows``: a table output's keys not updated for that long (not given: kept for good, a table holds each
    key's latest value). ``quarantine``: the quarantine's Delta rows, by when they were quarantined.
    """

    partials_s: dict[Granularity, Duration] = Field({"second": 2 * 86400.0}, alias="partials")
    heartbeats_s: Duration = Field(86400.0, alias="heartbeats")
    publish_log_s: Duration = Field(2 * 86400.0, alias="publish_log")
    contributions_s: Duration = Field(30 * 86400.0, alias="contributions")
    failover_events_s: Duration = Field(30 * 86400.0, alias="failover_events")
    events_s: Duration = Field(30 * 86400.0, alias="events")
    table_rows_s: Duration | None = Field(None, alias="table_rows")
    quarantine_s: Duration = Field(30 * 86400.0, alias="quarantine")


class MaintenanceConfig(StrictModel):
    """Upkeep of a plan's storage by its maintenance DAG (:mod:`tandem.batch.upkeep`, :mod:`tandem.batch.trim`).

    ``compact``: rewrite each Delta table's small files into few large ones (and write a log checkpoint), under
    the live appends. ``vacuum_retention``: files a commit removed are deleted once they are older than this,
    except those of the versions kept snapshots recorded (a restore's time travel needs them), in whole hours
    (delta-rs's unit, rounded up); the log's commits before a checkpoint go once they are older than it, except
    those a kept version needs. A reader of an older version must finish within it: at least a day and the kept
    snapshots' span (:func:`vacuum_retention_problem`). ``retention``: how long
    PostgreSQL keeps each kind of row.
    ``keep_input``: input files younger than this stay even once processed (not given: only what a restart or
    a kept snapshot needs stays), so that a backfill or the daily reconcile can recompute that far back; once no
    restart or restore needs them they move from ``landing/`` to ``retained/``, out of what the streams list.
    ``schedule``: the maintenance DAG's (cron or a preset), or ``manual``: it runs only when triggered (``tandem
    maintain``, the Airflow UI, an outside scheduler).
    """

    schedule: Annotated[StrictStr, AfterValidator(_cron_or_manual)] = "@hourly"
    compact: StrictBool = True
    vacuum_retention_s: Duration = Field(7 * 86400.0, alias="vacuum_retention")
    retention: RetentionConfig = RetentionConfig()
    keep_input_s: Duration | None = Field(None, alias="keep_input")

    @property
    def dag_schedule(self) -> str | None:
        """The maintenance DAG's ``schedule`` (``None``: triggered runs only)."""
        return None if self.schedule == MANUAL_SCHEDULE else self.schedule


class ReconcileConfig(StrictModel):
    """The daily reconcile of a plan's outputs against a batch recomputation (:mod:`tandem.batch.reconcile`).

    ``tolerance``: how many extra or different keys a run accepts before it fails (late events the stream
    dropped by design are counted apart and never fail it). ``repair``: hand the day to a backfill when the run
    found differences. The day's input must still be retained (``maintenance.keep_input`` of a day or more).
    """

    tolerance: Annotated[StrictInt, Field(ge=0)] = 0
    repair: StrictBool = False


class PlanFile(StrictModel):
    """The shape of ``conf/plans/<name>.yaml``."""

    name: Name
    description: StrictStr = ""
    module: Annotated[StrictStr, matching(MODULE_PATTERN, "a module of the tandem.plans package")] | None = None
    streams: Annotated[dict[Name, StreamConfig], Field(min_length=1)]
    groups: Annotated[dict[Name, GroupConfig], Field(min_length=1)]
    outputs: Annotated[dict[Name, OutputConfig], Field(min_length=1)]
    nodes: Names
    trigger_interval: Duration = 1.0
    watermark: Duration = 10.0
    state_horizon: Duration | None = None
    """How far back in event time a query's state reaches: the watermark plus its longest window, expiry or timer
    (default: the watermark plus an hour). A cut-over (:mod:`tandem.cutover`) replays this much of the input
    before the cut to rebuild the state of queries whose outputs are published by id."""
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    validation: ValidationConfig = ValidationConfig()
    ha: HAConfig = HAConfig()
    snapshot: SnapshotConfig = SnapshotConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    reconcile: ReconcileConfig = ReconcileConfig()


# --- cluster.yaml --------------------------------------------------------------------------------------------


class NodeSection(StrictModel):
    spark_master: Annotated[StrictStr, Field(min_length=1)]
    airflow_conn_id: Annotated[StrictStr, AfterValidator(_conn_id)] | None = None
    driver_memory: Annotated[StrictStr, matching(MEMORY_PATTERN, "a Spark memory size such as 512m or 2g")] = "1g"
    airflow_queue: Annotated[StrictStr, matching(QUEUE_PATTERN, "a queue name of letters, digits, '.', '_' and "
                                                                "'-' such as node-a")] | None = None


class DatabaseSection(StrictModel):
    url: Annotated[StrictStr, AfterValidator(_postgresql_url)] = "postgresql://postgres@127.0.0.1:5432/tandem"


class AirflowSection(StrictModel):
    api_url: Annotated[StrictStr, AfterValidator(_http_url)] = "http://127.0.0.1:8080"


def _nats_urls(value: str) -> str:
    """Comma-separated ``nats://`` / ``tls://`` URLs (the form ``TANDEM_NATS_URL`` takes)."""
    for url in value.split(","):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ValueError(f"expected nats:// or tls:// URLs with a host, got {redact_url(url.strip())!r}")
    return value


def _without_credentials(value: str) -> str:
    if urlsplit(value).username or urlsplit(value).password:
        raise ValueError(f"{redact_url(value)!r} holds credentials: give them in TANDEM_NATS_URL (the environment), "
                         "never in cluster.yaml")
    return value


_INLINE_SECRET = re.compile(r"^\s*S[A-Z][A-Z2-7]{56}\s*$|-----BEGIN|^\s*eyJ")


def _file_name(value: str) -> str:
    """The name of a file of secrets, never the secret itself (an NKEY seed, a PEM block, a JWT pasted in)."""
    if _INLINE_SECRET.search(value):
        raise ValueError("looks like a key, certificate or JWT itself: put it in a file (readable by Tandem's user "
                         "only) and name the file here")
    return value


FileName = Annotated[StrictStr, AfterValidator(_file_name)]


class NatsTLSSection(StrictModel):
    """TLS to the NATS servers beyond the URL's ``tls://``: names of PEM files, never their contents
    (``TANDEM_NATS_TLS_CA``, ``TANDEM_NATS_TLS_CERT``, ``TANDEM_NATS_TLS_KEY`` override them)."""

    ca_file: FileName | None = None
    """The CA the servers' certificates are checked against (default: the system's, or ``SSL_CERT_FILE``)."""
    cert_file: FileName | None = None
    """This client's certificate, for servers that verify clients."""
    key_file: FileName | None = None

    @model_validator(mode="after")
    def _certificate_with_its_key(self) -> NatsTLSSection:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together (a client certificate and its key)")
        return self


class NatsSection(StrictModel):
    """The messaging layer: NATS servers with JetStream (``TANDEM_NATS_URL`` overrides ``servers``, and carries
    credentials), and the prefix of Tandem's subjects and stream names."""

    servers: Annotated[list[Annotated[StrictStr, AfterValidator(_nats_urls), AfterValidator(_without_credentials)]],
                       Field(min_length=1)]
    prefix: Annotated[StrictStr, matching(NAME_PATTERN, "lower-case letters, digits, - and _, at most 63")] = "tandem"
    inbox_prefix: Annotated[StrictStr, matching(INBOX_PATTERN, "subject tokens of letters, digits, - and _ joined "
                                                               "by '.', no wildcard")] = "_INBOX"
    """Where Tandem's connections take replies and deliveries (a server's permissions may allow a user
    only ``<inbox_prefix>.>``; ``TANDEM_NATS_INBOX_PREFIX`` overrides it for one process)."""
    tls: NatsTLSSection | None = None
    nkey_seed_file: FileName | None = None
    """A file holding the NKEY seed of this process's user (``TANDEM_NATS_NKEY_SEED`` overrides it)."""
    creds_file: FileName | None = None
    """A ``.creds`` file (user JWT and seed) of this process's user (``TANDEM_NATS_CREDS`` overrides it)."""

    @model_validator(mode="after")
    def _one_kind_of_credentials(self) -> NatsSection:
        if self.nkey_seed_file and self.creds_file:
            raise ValueError("nkey_seed_file and creds_file: give one of them (a user is an NKEY or a JWT)")
        return self


class ClusterFile(StrictModel):
    """The shape of ``conf/cluster.yaml``."""

    storage_root: Annotated[StrictStr, AfterValidator(_storage_root)] = ".tandem/data"
    database: DatabaseSection = DatabaseSection()
    airflow: AirflowSection = AirflowSection()
    nats: NatsSection | None = None
    nodes: Annotated[dict[Name, NodeSection], Field(min_length=1)]


# --- what the rest of Tandem uses ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeConfig:
    """A named place where plan instances run: a Spark master, an Airflow connection, and the Airflow
    queue its host's worker serves (``None``: the node's tasks run where Airflow's default executor
    runs them, i.e. every node on one host)."""

    name: str
    spark_master: str
    airflow_conn_id: str
    driver_memory: str = "1g"
    airflow_queue: str | None = None


@dataclass(frozen=True)
class NatsConfig:
    """Where the messaging layer is: server URLs (from ``TANDEM_NATS_URL`` they may carry credentials: never
    print them without :func:`tandem.redaction.redact_url`) and the prefix of subjects and stream names."""

    servers: tuple[str, ...]
    prefix: str = "tandem"
    inbox_prefix: str = "_INBOX"
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    """Absolute paths of the files ``cluster.yaml``'s ``nats:`` (or the environment) names."""

    @property
    def file_variables(self) -> dict[str, str]:
        """The environment that names the same files to another process (a launched driver): variable, path."""
        return {variable: getattr(self, name) for name, variable in NATS_FILE_VARIABLES.items() if getattr(self, name)}


@dataclass(frozen=True)
class ClusterConfig:
    """``conf/cluster.yaml``: where data lives, the coordination database, the nodes and the messaging layer."""

    path: Path
    project_root: Path
    storage_root: Path
    database_url: str
    airflow_url: str
    nodes: dict[str, NodeConfig]
    scratch_root: Path
    """The host-local folder of the drivers' temporary files (one folder per instance under it):
    ``TANDEM_SCRATCH_DIR`` (relative: to the project root), or ``<temp dir>/tandem-<digest of the storage root>``
    so that two projects on one host stay apart (:func:`default_scratch_root`)."""
    nats: NatsConfig | None = None
    plans_folder: Path | None = None
    """``TANDEM_PLANS_DIR``, resolved (``None``: not set; see :attr:`plans_dir`)."""

    @property
    def conf_dir(self) -> Path:
        return self.path.parent

    @property
    def plans_dir(self) -> Path:
        """The folder of the plans' files (``<name>.yaml`` and ``<name>.py``): ``TANDEM_PLANS_DIR`` when set, else
        ``plans/`` in the configuration folder."""
        return self.plans_folder or self.conf_dir / "plans"

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
class PlanConfig:
    """``conf/plans/<name>.yaml``: one streaming application and its policies."""

    path: Path
    name: str
    description: str
    module: str
    streams: dict[str, StreamConfig]
    groups: dict[str, GroupConfig]
    outputs: dict[str, OutputConfig]
    nodes: tuple[str, ...]
    trigger_interval_s: float
    watermark_s: float
    state_horizon_s: float = 3610.0
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    ha: HAConfig = field(default_factory=HAConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)

    @property
    def instances(self) -> tuple[str, ...]:
        """Every HA unit of the plan: the instances ``<group>-<n>`` of every group, in order."""
        return tuple(i for name, group in self.groups.items() for i in instance_ids(name, group.parallel))

    def group_of(self, instance: str) -> tuple[str, int]:
        """``(group, index)`` of an instance id ``<group>-<index>``."""
        self.check_instance(instance)
        group, _, index = instance.rpartition("-")
        return group, int(index)

    def partitions(self, instance: str, stream: str) -> list[int]:
        """The partitions of ``stream`` the instance ``instance`` reads."""
        group, index = self.group_of(instance)
        return instance_partitions(index, self.groups[group].parallel, self.streams[stream].partitions)

    def publisher_of(self, stream: str) -> str | None:
        """The output published to ``stream`` (``None``: events come from outside, producers write them)."""
        return next((name for name, output in self.outputs.items() if output.stream == stream), None)

    @property
    def input_streams(self) -> list[str]:
        """The streams producers write to: every stream no output of the plan publishes to and no other plan declares
        (``from_plan``)."""
        return [name for name in self.streams if self.publisher_of(name) is None and self.from_plan(name) is None]

    def from_plan(self, stream: str) -> str | None:
        """The plan whose NATS stream ``stream`` is (``from_plan``: this plan only reads it), ``None``: this plan's."""
        return self.streams[stream].from_plan

    def check_instance(self, instance: str) -> str:
        """``instance`` if it is one of the plan's group instances, else a :class:`ConfigError` naming the plan file
        and its groups (where the instances come from)."""
        if instance not in self.instances:
            raise ConfigError(str(self.path), "groups", f"{instance!r} is not an instance of plan {self.name} "
                                                        f"(instances: {', '.join(self.instances)})")
        return instance

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


PLANS_DIR_VARIABLE = "TANDEM_PLANS_DIR"


def configured_plans_dir() -> Path | None:
    """The folder ``TANDEM_PLANS_DIR`` names, resolved (``None`` when it is not set): plans kept outside the
    configuration folder. A :class:`ConfigError` naming the variable when it is no folder."""
    configured = os.environ.get(PLANS_DIR_VARIABLE, "").strip()
    if not configured:
        return None
    folder = Path(configured).resolve()
    if not folder.is_dir():
        raise ConfigError(f"{PLANS_DIR_VARIABLE} (environment)", "",
                          f"{folder} is not a folder: it names the folder of the plans' files (<name>.yaml and "
                          "<name>.py); unset it to keep them in plans/ of the configuration folder")
    return folder


def plans_dir(configuration: Path | None = None) -> Path:
    """The plans folder without loading ``cluster.yaml``: ``TANDEM_PLANS_DIR``, else ``plans/`` of
    ``configuration`` (default: :func:`conf_dir`); :attr:`ClusterConfig.plans_dir` of the loaded cluster."""
    return configured_plans_dir() or (configuration or conf_dir()) / "plans"


# --- reading files -------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a mapping key given twice is an error (YAML lets the later one win)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise _DuplicateKey(key, line, seen[key])
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(key, line, first_line)
        self.key, self.line, self.first_line = key, line, first_line


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _read_yaml(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), "", "file not found") from None
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", f"not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader) or {}
    except _DuplicateKey as exc:
        raise ConfigError(str(path), f"line {exc.line}",
                          f"duplicate key {exc.key!r} (first at line {exc.first_line}; YAML would keep the later one)"
                          ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(unknown position)"
        raise ConfigError(str(path), where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None


def _without_empty_values(data: Any) -> Any:
    """An empty YAML value (``heartbeat:`` with nothing after it) means the default, as if the key were absent.

    A node given with nothing (``node-a:``) stays, as a node with no settings (its required ones are missing).
    """
    if not isinstance(data, dict):
        return data
    kept = {key: _without_empty_values(value) for key, value in data.items() if value is not None}
    if isinstance(kept.get("nodes"), dict):
        kept["nodes"] = {name: _without_empty_values(node) if node is not None else {}
                         for name, node in data["nodes"].items()}
    return kept


def _field(loc: tuple) -> str:
    """Pydantic's error location as a dotted field: ``nodes.node-a.driver_memory``, ``instances[1]``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            continue
        else:
            text += f".{part}" if text else str(part)
    return text


_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false", type(None): "nothing"}


def _problem(error: dict, model: type[BaseModel]) -> str:
    """One error of pydantic's as the sentence Tandem shows (no pydantic jargon, the value quoted)."""
    kind, value = error["type"], error.get("input")
    got = _TYPE_NAMES.get(type(value), type(value).__name__) if kind.endswith("_type") else repr(value)[:80]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"unknown field (allowed here: {_allowed(model, error['loc'][:-1])})"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {type(value).__name__}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {repr(value)[:80]}"
    if kind == "string_type":
        return f"expected a string, got {repr(value)[:80]}"
    if kind == "list_type":
        return f"expected a list, got {got}"
    if kind == "greater_than":
        return f"must be a positive integer, got {repr(value)[:80]}"
    if kind == "too_short":
        return "must name at least one" if isinstance(value, (dict, list)) else f"must not be empty, got {value!r}"
    if kind == "literal_error":
        expected = error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        kind_of = "" if isinstance(value, str) else "a string, "
        return f"expected {kind_of}one of {expected}, got {repr(value)[:80]}"
    if kind == "finite_number":
        return f"must be a finite number, got {repr(value)[:80]}"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return f"{error['msg']} (got {repr(value)[:80]})"


NUMBER_ERRORS = frozenset({"int_type", "float_type", "int_parsing", "float_parsing", "int_from_float"})


def _problems(errors: list[dict], model: type[BaseModel]) -> list[tuple[tuple, str]]:
    """Pydantic's errors as ``(location, sentence)``, one per field (pure): a value no member of a union (``int |
    float``) takes gives an error per member, located at ``(…, field, member)``; those are one problem of the field."""
    found: dict[tuple, list[dict]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        siblings = [e for e in errors if len(e["loc"]) == len(loc) and tuple(e["loc"][:-1]) == loc[:-1]
                    and isinstance(loc[-1], str) and isinstance(e["loc"][-1], str) and e["loc"][-1] != loc[-1]
                    and e.get("input") is error.get("input")]
        found.setdefault(loc[:-1] if siblings else loc, []).append(error)
    problems = []
    for loc, members in found.items():
        if len(members) > 1 and all(e["type"] in NUMBER_ERRORS for e in members):
            problem = f"expected a number, got {repr(members[0].get('input'))[:80]}"
        else:
            problem = " or ".join(dict.fromkeys(_problem(e, model) for e in members))
        problems.append((loc, problem))
    return problems


def _allowed(model: type[BaseModel], loc: tuple) -> str:
    for part in loc:
        if isinstance(part, int) or part == "[key]":
            continue
        field_info = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        annotation = getattr(field_info, "annotation", None) if field_info else None
        nested = next((a for a in getattr(annotation, "__args__", ()) + (annotation,)
                       if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nested is None:
            break
        model = nested
    return ", ".join(sorted(f.alias or name for name, f in model.model_fields.items()))


def config_error(problems: list[ConfigError]) -> ConfigError:
    """One error for a file's ``problems`` (in their order, each once): the problem itself when there is one, else a
    :class:`~tandem.errors.ConfigProblems` holding them all (its message is theirs, one line each)."""
    unique = list({str(problem): problem for problem in problems}.values())
    return unique[0] if len(unique) == 1 else ConfigProblems(unique)


def _validated(model: type[StrictModel], data: Any, source: str) -> Any:
    """``model`` validated from ``data``; every problem a :class:`ConfigError` naming ``source`` and the field
    (:func:`config_error`)."""
    if not isinstance(data, dict):
        raise ConfigError(source, "(top level)", f"expected a mapping, got {_TYPE_NAMES.get(type(data), type(data).__name__)}")
    try:
        return model.model_validate(_without_empty_values(data))
    except ValidationError as exc:
        raise config_error([ConfigError(source, _field(loc), problem)
                            for loc, problem in _problems(exc.errors(include_url=False), model)]) from None


def _from_environment(variable: str, model: type[StrictModel], key: str) -> Any | None:
    """An override from an environment variable, validated as ``model.key`` is (an error names the variable)."""
    value = os.environ.get(variable)
    if not value:
        return None
    info = model.model_fields[key]
    try:
        return TypeAdapter(Annotated[(info.annotation, *info.metadata)]).validate_python(value)
    except ValidationError as exc:
        raise ConfigError(f"{variable} (environment)", "", _problem(exc.errors(include_url=False)[0], model)) from None


# --- loading -------------------------------------------------------------------------------------------------


def load_cluster(path: Path | None = None) -> ClusterConfig:
    """Load ``cluster.yaml`` (default ``$TANDEM_CONF_DIR/cluster.yaml``) with env overrides applied."""
    path = (path or conf_dir() / "cluster.yaml").resolve()
    data = _read_yaml(path)
    if isinstance(data, dict) and os.environ.get("TANDEM_DATABASE_URL") and isinstance(data.get("database"), dict):
        data = {**data, "database": {k: v for k, v in data["database"].items() if k != "url"}}  # the env wins
    file = _validated(ClusterFile, data, str(path))
    root = Path(os.environ["TANDEM_HOME"]).resolve() if os.environ.get("TANDEM_HOME") else path.parent.parent
    storage = Path(_from_environment("TANDEM_STORAGE_ROOT", ClusterFile, "storage_root") or file.storage_root)
    nodes = {
        name: NodeConfig(name=name, spark_master=node.spark_master,
                         airflow_conn_id=node.airflow_conn_id or "tandem_" + name.replace("-", "_"),
                         driver_memory=node.driver_memory, airflow_queue=node.airflow_queue)
        for name, node in file.nodes.items()
    }
    storage = storage if storage.is_absolute() else (root / storage).resolve()
    plans = configured_plans_dir()
    scratch = os.environ.get("TANDEM_SCRATCH_DIR")
    return ClusterConfig(
        path=path,
        project_root=root,
        storage_root=storage,
        database_url=_from_environment("TANDEM_DATABASE_URL", DatabaseSection, "url") or file.database.url,
        airflow_url=_from_environment("TANDEM_AIRFLOW_URL", AirflowSection, "api_url") or file.airflow.api_url,
        nodes=nodes,
        nats=_nats(file.nats, path),
        scratch_root=(root / scratch).resolve() if scratch else default_scratch_root(storage),
        plans_folder=plans,
    )


def default_scratch_root(storage_root: Path) -> Path:
    """``<temp dir>/tandem-<digest of the storage root>``: host-local, and apart for each project on the host."""
    return Path(tempfile.gettempdir()) / f"tandem-{hashlib.sha256(str(storage_root).encode()).hexdigest()[:12]}"


NATS_FILE_VARIABLES = {"tls_ca_file": "TANDEM_NATS_TLS_CA", "tls_cert_file": "TANDEM_NATS_TLS_CERT",
                       "tls_key_file": "TANDEM_NATS_TLS_KEY", "nkey_seed_file": "TANDEM_NATS_NKEY_SEED",
                       "creds_file": "TANDEM_NATS_CREDS"}
"""The environment variables that name the messaging layer's files for one process (one NATS user per role:
the receiver's, the drivers'...), over ``cluster.yaml``'s ``nats:`` fields."""
_NATS_FIELDS = {"tls_ca_file": "tls.ca_file", "tls_cert_file": "tls.cert_file", "tls_key_file": "tls.key_file",
                "nkey_seed_file": "nkey_seed_file", "creds_file": "creds_file"}


def _nats(section: NatsSection | None, path: Path) -> NatsConfig | None:
    """The messaging layer: ``TANDEM_NATS_URL`` (comma-separated URLs) wins over ``nats.servers``; set alone, it
    configures NATS with the default prefix. The files it names (``TANDEM_NATS_*`` over ``cluster.yaml``,
    relative paths from the folder of ``cluster.yaml``) are not read here: a host that never connects needs none.

    Raises:
        ConfigError: credentials would cross the network in clear text (:func:`_clear_text_problem`).
    """
    override = os.environ.get("TANDEM_NATS_URL")
    if override:
        try:
            _nats_urls(override)
        except ValueError as exc:
            raise ConfigError("TANDEM_NATS_URL (environment)", "", str(exc)) from None
        servers = tuple(url.strip() for url in override.split(",") if url.strip())
        section = section or NatsSection(servers=["nats://127.0.0.1:4222"])  # the defaults of its other settings
    elif section is None:
        return None
    else:
        servers = tuple(section.servers)
    tls = section.tls or NatsTLSSection()
    declared = {"tls_ca_file": tls.ca_file, "tls_cert_file": tls.cert_file, "tls_key_file": tls.key_file,
                "nkey_seed_file": section.nkey_seed_file, "creds_file": section.creds_file}
    sources = {name: f"{path}: nats.{_NATS_FIELDS[name]}" for name in declared}
    environment = {name: os.environ[variable] for name, variable in NATS_FILE_VARIABLES.items()
                   if os.environ.get(variable)}
    if {"nkey_seed_file", "creds_file"} & set(environment):  # the process's own user replaces cluster.yaml's
        declared["nkey_seed_file"] = declared["creds_file"] = None
    for name, value in environment.items():
        try:
            declared[name] = _file_name(value)
        except ValueError as exc:
            raise ConfigError(f"{NATS_FILE_VARIABLES[name]} (environment)", "", str(exc)) from None
        sources[name] = f"{NATS_FILE_VARIABLES[name]} (environment)"
    if declared["nkey_seed_file"] and declared["creds_file"]:
        raise ConfigError(sources["creds_file"], "", f"and {sources['nkey_seed_file']} both name credentials: give "
                                                     "one (a user is an NKEY or a JWT)")
    files = {name: str((path.parent / value).resolve()) if value else None for name, value in declared.items()}
    inbox_prefix = _from_environment("TANDEM_NATS_INBOX_PREFIX", NatsSection, "inbox_prefix") or section.inbox_prefix
    nats = NatsConfig(servers, section.prefix, inbox_prefix, **files)
    problem = _clear_text_problem(nats, sources)
    if problem is not None:
        raise ConfigError("TANDEM_NATS_URL (environment)" if override else str(path),
                          "" if override else f"nats.servers[{problem[0]}]", problem[1])
    return nats


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _clear_text_problem(nats: NatsConfig, sources: Mapping[str, str]) -> tuple[int, str] | None:
    """``(index of the server, why)`` when credentials would reach a server over plain ``nats://`` on another host
    (pure): a password, token or JWT would cross the network readable, and an NKEY's user would be open to an
    impostor in the middle; TLS (``tls://``) is needed, or a server on this host."""
    given = [sources[name] for name in ("nkey_seed_file", "creds_file") if getattr(nats, name)]
    for index, url in enumerate(nats.servers):
        parts = urlsplit(url)
        if parts.scheme != "nats" or _is_loopback(parts.hostname or ""):
            continue
        held = given + (["the user and password or token in the URL"] if parts.username else [])
        if held:
            return index, (f"{redact_url(url)} is plain nats:// to another host, and credentials are given "
                           f"({'; '.join(held)}): they would cross the network in clear text. Use "
                           f"tls://{parts.hostname}:{parts.port or 4222} (the server's TLS), or a server on this host")
    return None


def no_messaging_layer(cluster: ClusterConfig, source: str) -> str:
    """Why a stream of the kind ``source`` (one on the messaging layer) cannot be used with ``cluster`` (it has
    none)."""
    return (f"a {source} stream needs the messaging layer: a nats: section (servers) in {cluster.path} or "
            "TANDEM_NATS_URL")


def nats_of(cluster: ClusterConfig, plan: PlanConfig, stream: str) -> NatsConfig:
    """The messaging layer ``stream`` of ``plan`` is on; a :class:`ConfigError` naming the field when there is none."""
    if cluster.nats is None:
        raise ConfigError(str(plan.path), f"streams.{stream}.source",
                          no_messaging_layer(cluster, plan.streams[stream].source))
    return cluster.nats


def load_plan(name: str, cluster: ClusterConfig | None = None) -> PlanConfig:
    """Load the plan ``name`` (``<plans folder>/<name>.yaml``, :attr:`ClusterConfig.plans_dir`), checked against
    the cluster.

    Only names are taken (``tandem status ../x/trades.yaml`` is refused): a plan is found in the plans folder,
    nowhere else (``TANDEM_PLANS_DIR`` moves that folder).
    """
    cluster = cluster or load_cluster()
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(str(cluster.plans_dir), "(plan name)",
                          f"{str(name)[:80]!r} is not a plan name: plans are named {NAME_PATTERN.pattern} and found "
                          f"in {cluster.plans_dir}")
    return _load_plan_file(cluster.plans_dir / f"{name}.yaml", cluster)


def _load_plan_file(path: Path, cluster: ClusterConfig) -> PlanConfig:
    path = path.resolve()
    file = _validated(PlanFile, _read_yaml(path), str(path))

    problems: list[ConfigError] = []  # every refusal of the file, reported together

    def error(field_name: str, problem: str) -> ConfigError:
        return ConfigError(str(path), field_name, problem)

    def refuse(field_name: str, problem: str) -> None:
        problems.append(error(field_name, problem))

    if file.name != path.stem:
        refuse("name", f"{file.name!r} must equal the file name {path.stem!r}")
    for index, node in enumerate(file.nodes):
        if node not in cluster.nodes:
            refuse(f"nodes[{index}]", f"unknown node {node!r} (cluster.yaml defines {', '.join(cluster.nodes)})")
    for name, output in file.outputs.items():
        if "table" in output.rules.may and output.table is None:  # a kind naming its own table has a default one
            table = output.serving_table(file.name, name)
            try:
                TypeAdapter(FieldName).validate_python(table)
            except ValidationError as exc:
                refuse(f"outputs.{name}.table", f"the default table name {exc.errors()[0]['ctx']['error']}: "
                                                "name the table with table:")
    publishers: dict[str, str] = {}
    for name, output in file.outputs.items():
        if output.stream is None:
            continue
        where = f"outputs.{name}.stream"
        if output.stream not in file.streams:
            refuse(where, f"no stream {output.stream!r} is declared (streams: {', '.join(file.streams)})")
        elif not file.streams[output.stream].rules.published_to:
            kinds = sources_where("published_to")
            refuse(where, f"stream {output.stream!r} must be a {kinds} stream (source: {kinds}): an output is "
                          "published to NATS")
        elif output.stream in publishers:
            refuse(where, f"stream {output.stream!r} is published by output {publishers[output.stream]!r} "
                          "already: a stream has one publishing output")
        elif file.streams[output.stream].from_plan is not None:
            refuse(where, f"stream {output.stream!r} is plan {file.streams[output.stream].from_plan}'s "
                          f"(streams.{output.stream}.from_plan): an output publishes to a stream of its own plan")
        else:
            publishers[output.stream] = name
    for name, stream in file.streams.items():
        if stream.rules.on_messaging_layer and cluster.nats is None:
            refuse(f"streams.{name}.source", no_messaging_layer(cluster, stream.source))
        if stream.from_plan == file.name:
            refuse(f"streams.{name}.from_plan", "names this plan: from_plan names another plan, whose stream "
                                                "this one reads")
    booleans = {field for stream in file.streams.values() for field, f in stream.fields.items() if f.type == "boolean"}
    for name, output in file.outputs.items():
        for column, measure in output.measures.items():
            if measure.function in ("sum", "min", "max") and measure.type is None and measure.source in booleans:
                refuse(f"outputs.{name}.measures.{column}", f"the {measure.function} of {measure.source!r}, a boolean "
                       "field: count the events a query keeps instead (a count measure), or give the measure a type")
    listed: dict[str, str] = {}  # query -> the group that lists it first
    for name, group in file.groups.items():
        for index, query in enumerate(group.queries):
            if query in listed:
                refuse(f"groups.{name}.queries[{index}]", f"query {query!r} is listed in more than one group "
                                                          f"(in group {listed[query]} too; a query runs in exactly "
                                                          "one group, once)")
            listed.setdefault(query, name)
    _check_retention(file, refuse)
    try:
        outputs, groups = _with_quarantine(file, error)
    except ConfigError as exc:
        problems.append(exc)
    if file.module is not None and path.with_suffix(".py").is_file():
        refuse("module", f"names {file.module!r}, but {path.with_suffix('.py').name} beside the plan is its "
                         "module: remove one of them")
    suites = cluster.conf_dir / "expectations"
    for field_name, suite in (("validation.suite", file.validation.suite), ("snapshot.suite", file.snapshot.suite)):
        if suite is not None and not (suites / f"{suite}.json").is_file():
            refuse(field_name, f"no suite {suite!r}: {suites / f'{suite}.json'} does not exist")
    if problems:
        raise config_error(problems)
    validation = file.validation.model_copy(update={"suite": _suite_file(
        file.validation.suite, suites, f"{file.name}_outputs", f"{file.name}_aggregates")})
    snapshot = file.snapshot.model_copy(update={"suite": _suite_file(
        file.snapshot.suite, suites, f"{file.name}_state")})
    return PlanConfig(
        path=path,
        name=file.name,
        description=file.description,
        module=file.module or f"tandem.plans.{file.name}",
        streams=dict(file.streams),
        groups=groups,
        outputs=outputs,
        nodes=tuple(file.nodes),
        trigger_interval_s=file.trigger_interval,
        watermark_s=file.watermark,
        state_horizon_s=file.state_horizon if file.state_horizon is not None else file.watermark + 3600.0,
        heartbeat=file.heartbeat,
        validation=validation,
        ha=file.ha,
        snapshot=snapshot,
        maintenance=file.maintenance,
        reconcile=file.reconcile,
    )


MIN_VACUUM_RETENTION_S = 86400.0
"""The shortest ``maintenance.vacuum_retention`` accepted: Tandem vacuums with Delta's own check off (it keeps the
declared retention to the second), so it checks here instead, with a floor of a day where Delta's is seven: a job
that opened a Delta version (a restore, a backfill, a reconcile, a page) must finish before its files go."""


def vacuum_retention_problem(vacuum_retention_s: float, snapshot: SnapshotConfig) -> str | None:
    """Why a plan's vacuum retention is too short for what reads its Delta tables' older versions, or ``None``
    (pure): under :data:`MIN_VACUUM_RETENTION_S`, or under the span of its kept snapshots (``snapshot.keep`` ×
    ``snapshot.interval``, the age of the oldest one retention keeps), to whose time a restore and a look at the
    outputs as they were travel back."""
    def days(seconds: float) -> str:
        return f"{seconds / 86400:g} day{'' if seconds == 86400 else 's'}"

    span = snapshot.keep * snapshot.interval_s
    if vacuum_retention_s < MIN_VACUUM_RETENTION_S:
        return (f"{days(vacuum_retention_s)} is shorter than {days(MIN_VACUUM_RETENTION_S)} (the least Tandem keeps: "
                "a job that opened an older Delta version, a restore or a backfill, must finish before its files go)")
    if vacuum_retention_s < span:
        return (f"{days(vacuum_retention_s)} is shorter than the {days(span)} the kept snapshots span (snapshot.keep "
                f"{snapshot.keep} × snapshot.interval {days(snapshot.interval_s)}): a restore travels back that far")
    return None


def _check_retention(file: PlanFile, refuse: Callable[[str, str], None]) -> None:
    """Refuse (``refuse(field, problem)``, each) retentions that would delete rows the running plan still writes or
    reads."""
    retention = file.maintenance.retention
    kept = retention.partials_s
    order = list(Granularity.__args__)
    for granularity, seconds in kept.items():
        if seconds <= file.watermark:
            refuse(f"maintenance.retention.partials.{granularity}",
                   f"must be longer than the plan's watermark ({file.watermark:g} s): the stream still adds to "
                   "buckets that young")
    for index, finer in enumerate(order):
        coarser = next((g for g in order[index + 1:] if kept.get(g, math.inf) < kept.get(finer, math.inf)), None)
        if coarser is not None:
            refuse(f"maintenance.retention.partials.{finer if finer in kept else coarser}",
                   f"keeps {finer} partials longer than {coarser} ones: a coarser bucket is rolled up from finer "
                   "ones, keep it at least as long")
            break  # one line for the order: the next finer granularity would name the same coarser one
    keep_input = file.maintenance.keep_input_s
    # ids that are contributions applied once (a latest output's id only orders its rows)
    by_id = [name for name, output in file.outputs.items() if output.id and output.rules.contributions_by_id]
    if by_id and keep_input is not None and keep_input > retention.contributions_s:
        refuse("maintenance.keep_input",
               f"keeps input {keep_input / 86400:g} days, longer than maintenance.retention.contributions "
               f"({retention.contributions_s / 86400:g} days): a backfill of input that old would publish again the "
               f"rows of {', '.join(by_id)} whose ids are gone (published once by id); keep contributions at least "
               "as long as input")
    problem = vacuum_retention_problem(file.maintenance.vacuum_retention_s, file.snapshot)
    if problem:
        refuse("maintenance.vacuum_retention", problem)
    for where, seconds, needed, what in (
            ("heartbeats", retention.heartbeats_s, file.ha.stall_timeout_s, "ha.stall_timeout"),
            ("failover_events", retention.failover_events_s, file.ha.launch_window_s, "ha.launch_window")):
        if seconds <= needed:
            refuse(f"maintenance.retention.{where}", f"must be longer than {what} ({needed:g} s): the "
                                                     "supervisor reads that far back")


def _with_quarantine(file: PlanFile, error: Callable[[str, str], ConfigError]
                     ) -> tuple[dict[str, OutputConfig], dict[str, GroupConfig]]:
    """The plan's outputs and groups with its quarantine: the output (``quarantine``, implicit when none is
    declared) and the runtime's ``quarantine`` query (in the first group when no group lists it)."""
    outputs, groups = dict(file.outputs), dict(file.groups)
    declared = [name for name, output in outputs.items() if output.kind == QUARANTINE]
    if len(declared) > 1:
        raise error(f"outputs.{declared[1]}", f"a plan has one quarantine output ({declared[0]!r} is one)")
    if QUARANTINE in outputs and outputs[QUARANTINE].kind != QUARANTINE:
        raise error(f"outputs.{QUARANTINE}", f"the name {QUARANTINE!r} is the plan's quarantine output's (kind "
                                            f"{QUARANTINE}): give this {outputs[QUARANTINE].kind} output another name")
    if not declared:
        outputs[QUARANTINE] = OutputConfig(kind=QUARANTINE)
    if not any(QUARANTINE_QUERY in group.queries for group in groups.values()):
        first = next(iter(groups))
        groups[first] = groups[first].model_copy(update={"queries": [*groups[first].queries, QUARANTINE_QUERY]})
    return outputs, groups


def quarantine_output(plan: PlanConfig) -> str:
    """The name of the plan's quarantine output (every loaded plan has exactly one)."""
    return next(name for name, output in plan.outputs.items() if output.kind == QUARANTINE)


def _suite_file(named: str | None, folder: Path, *defaults: str) -> str | None:
    """The suite a plan validates with: the one it names, else the first default with a file in
    ``folder``, else ``None`` (the suite implied by the plan's declarations)."""
    return named or next((name for name in defaults if (folder / f"{name}.json").is_file()), None)


def load_plans(cluster: ClusterConfig | None = None) -> dict[str, PlanConfig]:
    """Every plan in ``conf/plans/``, by name (a :class:`ConfigError` for the first that does not load, or whose
    NATS streams collide with another's: :func:`shared_stream_errors`)."""
    cluster = cluster or load_cluster()
    plans = {path.stem: _load_plan_file(path, cluster) for path in sorted(cluster.plans_dir.glob("*.yaml"))}
    for problem in shared_stream_errors(plans, cluster).values():
        raise problem
    return plans


def shared_stream_errors(plans: Mapping[str, PlanConfig], cluster: ClusterConfig,
                         broken: Collection[str] = ()) -> dict[str, ConfigError]:
    """Each plan whose NATS streams collide with another plan's, with the error naming both files and fields (pure).

    A NATS stream (``<prefix>_<stream>``, subjects ``<prefix>.<stream>.<partition>``) belongs to the one plan that
    declares it without ``from_plan``: its producers and receiver write to it, or one of its outputs publishes
    to it. Another plan may read it on purpose by declaring the same stream with ``from_plan: <that plan>``, the
    same partitions, key and retention (so that both create the same JetStream stream and read the same
    partitions). Refused: two plans declaring the same stream without ``from_plan`` (one would write into the
    other's stream: an output's relay stops at a message it did not publish, and readers mix both plans'
    events): when one of them publishes an output to it, the others are refused, else all of them; and a
    ``from_plan`` naming a plan that does not declare the stream as its own, or declaring it otherwise.
    ``broken``: plans that did not load (a stream read from one of them is not checked).
    """
    prefix = cluster.nats.prefix if cluster.nats else "tandem"
    owners: dict[str, list[PlanConfig]] = {}
    for plan in plans.values():
        for name, stream in plan.streams.items():
            if stream.rules.shared and stream.from_plan is None:
                owners.setdefault(name, []).append(plan)
    errors: dict[str, ConfigError] = {}
    for name, declaring in owners.items():
        publishing = [plan for plan in declaring if plan.publisher_of(name) is not None]
        for plan in declaring:
            others = [other for other in declaring if other is not plan]
            if len(publishing) == 1 and plan is publishing[0]:
                continue  # the plan whose output publishes to it keeps it: the others are refused
            if others and plan.name not in errors:
                other = publishing[0] if len(publishing) == 1 else others[0]
                errors[plan.name] = ConfigError(
                    str(plan.path), f"streams.{name}",
                    f"the NATS stream {prefix}_{name} (subjects {prefix}.{name}.*) is declared by plan {other.name} "
                    f"too ({other.path}: streams.{name}): two plans would write to one stream. Rename one of them, or, "
                    f"if this plan reads {other.name}'s stream on purpose, declare it with from_plan: {other.name}")
    for plan in plans.values():
        for name, stream in plan.streams.items():
            source = stream.from_plan
            if source is None or plan.name in errors or source in broken:
                continue
            field_name = f"streams.{name}.from_plan"
            owner = plans.get(source)
            if owner is None:
                problem = f"no plan {source!r} (plans: {', '.join(sorted(plans)) or 'none'})"
            elif name not in owner.streams or not owner.streams[name].rules.shared:
                problem = f"plan {source} ({owner.path}) declares no {sources_where('shared')} stream {name!r}"
            elif owner.streams[name].from_plan is not None:
                problem = (f"plan {source} ({owner.path}: streams.{name}.from_plan) reads stream {name} from plan "
                           f"{owner.streams[name].from_plan} itself: name that plan")
            else:
                theirs, differs = owner.streams[name], []
                for setting in ("partitions", "key", "retention"):
                    if getattr(stream, setting) != getattr(theirs, setting):
                        differs.append(f"{setting} {_shown(getattr(stream, setting))} here, "
                                       f"{_shown(getattr(theirs, setting))} in {owner.path}: streams.{name}.{setting}")
                key_path, their_key_path = (s.fields[s.key].label(s.key) for s in (stream, theirs))
                if stream.key == theirs.key and key_path != their_key_path:
                    differs.append(f"key read from {key_path!r} here, from {their_key_path!r} in {owner.path}: "
                                   f"streams.{name}.fields.{theirs.key}.from")
                if not differs:
                    continue
                problem = f"must declare stream {name} as plan {source} does: {'; '.join(differs)}"
            errors[plan.name] = ConfigError(str(plan.path), field_name, problem)
    return errors


def _shown(value: Any) -> str:
    return repr(value.model_dump(by_alias=True, exclude_none=True)) if isinstance(value, BaseModel) else repr(value)


def load_plans_and_errors(cluster: ClusterConfig | None = None) -> tuple[dict[str, PlanConfig], dict[str, ConfigError]]:
    """Every plan in ``conf/plans/`` that loads, by name, and apart from them each broken one's error, by file name.

    One broken file (invalid YAML, a refused field, an unknown node ...) leaves the other plans usable: for
    what serves or shows every plan (DAG files, the Tandem page, ``tandem status``). A plan whose NATS streams
    collide with another plan's is broken too (:func:`shared_stream_errors`). A caller that must not
    act while any plan is unknown (landing retention: another plan may read the files) uses :func:`load_plans`,
    which raises the first broken plan's error. Each error is the :class:`ConfigError` that names the file and
    the field, keyed by the file's name without ``.yaml`` (which is the plan's name when the file is valid).
    """
    cluster = cluster or load_cluster()
    plans: dict[str, PlanConfig] = {}
    broken: dict[str, ConfigError] = {}
    for path in sorted(cluster.plans_dir.glob("*.yaml")):
        try:
            plans[path.stem] = _load_plan_file(path, cluster)
        except ConfigError as exc:
            broken[path.stem] = exc
    for name, problem in shared_stream_errors(plans, cluster, broken).items():
        broken[name] = problem
        del plans[name]
    return plans, broken


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each configuration file (editors validate YAML with them)."""
    return {"cluster.yaml": ClusterFile.model_json_schema(by_alias=True),
            "plans/<name>.yaml": PlanFile.model_json_schema(by_alias=True)}
