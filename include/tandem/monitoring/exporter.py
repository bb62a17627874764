"""``tandem exporter``: the plane's metrics for Prometheus, read from PostgreSQL and the quarantine tables.

Purpose:
    Prometheus scrapes a target over HTTP; Airflow's API server wants Airflow credentials, which a scraper should
    not hold. The exporter is a process of its own, as ``postgres_exporter`` is: it serves ``/metrics`` (and
    ``/healthz``) on its own port, with its own bearer token when one is set, and reads what every driver, the
    supervisor and the batch jobs already record. No driver has to be reachable from Prometheus, and a host that
    is cut off shows up as what the others recorded about it.

How it works:
    Each scrape reads every plan's status as ``tandem status`` does (:func:`tandem.presenter.views.plan_status`),
    the role changes and published batches (through :class:`~tandem.monitoring.tally.Tally`, so the counters never
    go down when maintenance trims those tables), each query's newest progress, the snapshot catalog, the relays'
    positions, the batch jobs' runs, and the count of each quarantine table by reason class (read again only when
    the table's Delta version changed). :mod:`tandem.monitoring.samples` turns the readings into samples. When
    PostgreSQL cannot be read, the scrape answers ``tandem_up 0`` and nothing else (an alert fires on that).

Serving:
    One reading at a time: a scrape that arrives while one is under way, or within ``fresh_s`` (``--fresh-for``,
    :data:`DEFAULT_FRESH_S`) after the last one began, is answered from it, so two Prometheus servers (or a scrape
    storm) cost one reading. Its session is read-only (``default_transaction_read_only``), as the role of
    ``TANDEM_EXPORTER_DATABASE_URL`` may be too (a role granted only ``SELECT``; default: the cluster's URL). At most
    ``max_connections`` are open at once: a connection is dropped when it has not sent its request within
    ``read_timeout_s``, or when a newer one needs its place while it still has not (a scrape sends its request at
    once), so connections that send nothing hold no thread for long. Without a token it listens on loopback only.

What it does not do:
    It keeps no history (Prometheus does) and never writes to the coordination database. It is no web server for
    the internet: put it on a scrape network, with a token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from tandem.config import ClusterConfig, PlanConfig, quarantine_output
from tandem.errors import TandemError
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.monitoring import samples as sampled
from tandem.monitoring.catalog import METRICS
from tandem.monitoring.reasons import reason_class
from tandem.monitoring.tally import Tally
from tandem.presenter import configuration, views
from tandem.presenter.cache import VersionedCache
from tandem.store import monitoring as readings
from tandem.store.db import Database

log = logging.getLogger(__name__)
DEFAULT_PORT = 9464
"""The port ``tandem exporter`` listens on unless told (the range Prometheus' wiki keeps for exporters)."""
STATEMENT_TIMEOUT_S = 10.0
TOKEN_VARIABLE = "TANDEM_EXPORTER_TOKEN"
DATABASE_VARIABLE = "TANDEM_EXPORTER_DATABASE_URL"
"""The URL the exporter reads with, when set (a role granted only ``SELECT``); else the cluster's."""
SESSION_SETTINGS = {"statement_timeout": f"{round(STATEMENT_TIMEOUT_S * 1000)}ms",
                    "default_transaction_read_only": "on"}
"""Every exporter session: a slow query is cancelled, and no transaction may write (whatever the role may)."""
DEFAULT_READ_TIMEOUT_S = 5.0
"""How long a connection may take to send its request (``--read-timeout``); a scrape sends it at once."""
DEFAULT_MAX_CONNECTIONS = 32
"""How many connections may be open at once (``--max-connections``), each with its thread."""
DEFAULT_FRESH_S = 0.5
"""A scrape within this long of the last reading's start is answered from it (``--fresh-for``): shorter than any
sensible scrape interval, longer than the spread of scrapes that come together."""

QUARANTINE_COUNTS: VersionedCache[dict[tuple[str, str], int]] = VersionedCache(ttl_s=10.0)


def quarantine_counts(cluster: ClusterConfig, plan: PlanConfig) -> dict[tuple[str, str], int]:
    """Rows of the plan's quarantine table per (instance, reason class), read again when its Delta version moved."""
    path = delta_table_dir(cluster, plan.name, quarantine_output(plan))
    return QUARANTINE_COUNTS.get(str(path), lambda: views.delta_version(path),
                                 lambda version: _count_reasons(path, version))


def _count_reasons(path: Path, version: Any) -> dict[tuple[str, str], int]:
    if version is None:
        return {}
    table = read_table(path, columns=["instance", "reason"], version=version)
    counts: dict[tuple[str, str], int] = {}
    grouped = table.group_by(["instance", "reason"]).aggregate([([], "count_all")])
    for entry in grouped.to_pylist():  # counted by Arrow: a quarantine may hold millions of lines
        key = (entry["instance"], reason_class(entry["reason"]))
        counts[key] = counts.get(key, 0) + entry["count_all"]
    return counts


@dataclass(frozen=True)
class Reading:
    """The samples of one reading, and when it began and ended (``time.monotonic()``)."""

    values: sampled.Samples
    started: float
    finished: float


def reusable(reading: Reading | None, arrived: float, fresh_s: float) -> bool:
    """Whether a scrape that arrived at ``arrived`` is answered from ``reading`` (pure): it was under way when the
    scrape arrived (or began after), or it began at most ``fresh_s`` before."""
    return reading is not None and (reading.finished >= arrived or reading.started >= arrived - fresh_s)


def database_url(cluster: ClusterConfig) -> str:
    """The URL the exporter reads with: :data:`DATABASE_VARIABLE` when set, else the cluster's."""
    return _own_database_url() or cluster.database_url


def _own_database_url() -> str | None:
    url = os.environ.get(DATABASE_VARIABLE)
    if url is not None and not url.strip():
        raise TandemError(f"{DATABASE_VARIABLE} is set but empty: give it the URL of a read-only role or unset it")
    return url


@dataclass(eq=False)
class PlaneCollector:
    """The collector the exporter's registry asks on every scrape: one reading at a time, shared by the scrapes
    that :func:`reusable` says may have it."""

    fresh_s: float = DEFAULT_FRESH_S
    db: Database | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    failovers: Tally | None = None
    published: Tally | None = None
    last: Reading | None = None

    def describe(self) -> list[Metric]:
        return []  # the registry does not scrape at registration

    def collect(self) -> Iterator[Metric]:
        arrived = time.monotonic()
        with self.lock:
            if not reusable(self.last, arrived, self.fresh_s):
                self.last = self._reading()
            reading = self.last
        yield from families(reading.values)

    def _reading(self) -> Reading:
        started = time.monotonic()
        values = sampled.Samples()
        try:
            self._read(values)
            up = 1
        except Exception as exc:  # noqa: BLE001 - whatever fails, the scrape answers tandem_up 0 and says why
            log.warning("scrape failed: %s", " ".join(str(exc).split())[:500])
            values, up = sampled.Samples(), 0
        values.add("tandem_up", up)
        finished = time.monotonic()
        values.add("tandem_scrape_duration_seconds", finished - started)
        return Reading(values, started, finished)

    def _database(self, url: str) -> Database:
        if self.db is None or self.db.url != url:
            if self.db is not None:
                self.db.close()
            self.db = Database(url, "tandem-exporter", SESSION_SETTINGS)
            self.failovers = Tally(lambda since: readings.role_changes(self.db, since),
                                   lambda row: (row["plan"], row["instance"], sampled.failover_cause(row["kind"]),
                                                str(bool(row["moved"]))),
                                   lambda row: row["id"])
            self.published = Tally(lambda since: readings.published_rows(self.db, since),
                                   lambda row: (row["plan"], row["instance"], row["output"]),
                                   lambda row: (row["instance_id"], row["output"], row["batch_id"]))
        return self.db

    def _read(self, values: sampled.Samples) -> None:
        cluster, plans = configuration.current()
        db = self._database(database_url(cluster))
        for name in configuration.broken():
            sampled.add_broken_plan(values, name)
        for plan in plans.values():
            sampled.add_plan(values, plan, views.plan_status(db, cluster, plan))
            sampled.add_quarantine(values, plan.name, quarantine_output(plan), plan.instances,
                                   quarantine_counts(cluster, plan))
        assert self.failovers is not None and self.published is not None
        moved = {(plan, instance, cause): value for (plan, instance, cause, node_changed), value
                 in self.failovers.update().items() if node_changed == "True"}
        sampled.add_failovers(values, moved, [(p.name, i) for p in plans.values() for i in p.instances])
        sampled.add_published(values, self.published.update())
        sampled.add_engine(values, readings.engine_figures(db))
        sampled.add_snapshots(values, readings.snapshot_ages(db))
        sampled.add_relays(values, readings.relay_positions(db))
        sampled.add_jobs(values, *readings.job_runs(db))


def families(values: sampled.Samples) -> Iterator[Metric]:
    """The samples as Prometheus metric families, in the catalog's order."""
    for metric in METRICS:
        kind = CounterMetricFamily if metric.type == "counter" else GaugeMetricFamily
        family = kind(metric.name, metric.help, labels=list(metric.labels))
        for labels, value in sorted(values.values[metric.name].items()):
            family.add_metric(list(labels), value)
        yield family


def token_from(path: str | None) -> str | None:
    """The bearer token scrapes must send: the file ``path`` holds (stripped), else ``TANDEM_EXPORTER_TOKEN``, else
    none; an empty one is refused."""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise TandemError(f"--token-file {path}: cannot read it ({exc.strerror})") from None
        if not token:
            raise TandemError(f"--token-file {path}: the file is empty")
        return token
    token = os.environ.get(TOKEN_VARIABLE)
    if token is not None and not token.strip():
        raise TandemError(f"{TOKEN_VARIABLE} is set but empty: give it a token or unset it")
    return token.strip() if token else None


def guarded(app: Callable, token: str | None) -> Callable:
    """The WSGI app behind a bearer token (none: open), with ``/healthz`` for liveness probes."""

    def guard(environ: Mapping[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if token is not None:
            given = environ.get("HTTP_AUTHORIZATION", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                    ("WWW-Authenticate", 'Bearer realm="tandem exporter"')])
                return [b"a bearer token is required\n"]
        return app(environ, start_response)

    return guard


def addresses_of(host: str) -> set[str]:
    """The addresses ``host`` stands for: itself when an address, a name's as the resolver gives them, none for
    ``""`` (every interface) or a name that does not resolve (listening on it fails anyway, with its own message)."""
    if not host:
        return set()
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        return {info[4][0].split("%")[0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return set()


def start_refusal(host: str, addresses: Iterable[str], token: str | None, read_timeout_s: float,
                  max_connections: int, fresh_s: float) -> str | None:
    """Why the exporter must not start with these settings (``None``: it may; pure). ``addresses``: those ``host``
    stands for (:func:`addresses_of`); without a token each must be a loopback one."""
    if not 0 < read_timeout_s < math.inf:
        return f"--read-timeout must be a positive number of seconds, got {read_timeout_s:g}"
    if max_connections < 1:
        return f"--max-connections must be at least 1, got {max_connections}"
    if not 0 <= fresh_s < math.inf:
        return f"--fresh-for must be 0 seconds or more, got {fresh_s:g}"
    found = list(addresses)
    if token is None and not (found and all(ipaddress.ip_address(address).is_loopback for address in found)):
        return (f"--host {host or '(every interface)'}: without a bearer token the exporter listens on loopback only "
                f"(127.0.0.1, ::1): set --token-file or {TOKEN_VARIABLE}, or listen on 127.0.0.1")
    return None


class _Handler(WSGIRequestHandler):
    """One connection: its socket times out after the server's ``read_timeout_s``; once its request line and
    headers are in, the server may no longer drop it for a newer one."""

    server: ExporterServer

    def setup(self) -> None:
        self.timeout = self.server.read_timeout_s
        super().setup()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.request_read(self.connection)
        return parsed

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug(format, *args)


class ExporterServer(ThreadingWSGIServer):
    """A thread per connection, at most ``max_connections`` of them; a connection that has not sent its request
    within ``read_timeout_s`` is dropped, and so is the oldest such one when a new connection finds every place
    taken (if every open connection is a scrape being answered, the new one is closed at once)."""

    request_queue_size = 128  # a burst of connections waits to be accepted instead of being refused by the kernel

    def __init__(self, address: tuple[str, int], read_timeout_s: float, max_connections: int) -> None:
        self.read_timeout_s, self.max_connections = read_timeout_s, max_connections
        self._waiting: dict[socket.socket, float] = {}  # accepted, request not read yet: when accepted
        self._answering: set[socket.socket] = set()
        self._places = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._places:
            if len(self._waiting) + len(self._answering) >= self.max_connections:
                if not self._waiting:
                    log.debug("refused a connection from %s: %d scrapes are being answered", client_address,
                              len(self._answering))
                    return False
                self._drop(min(self._waiting, key=self._waiting.__getitem__))
            self._waiting[request] = time.monotonic()
        return True

    def request_read(self, request: socket.socket) -> None:
        """``request`` sent its request: it keeps its place until it is answered."""
        with self._places:
            if self._waiting.pop(request, None) is not None:
                self._answering.add(request)

    def service_actions(self) -> None:
        """Between two accepts (at least every half second): drop the connections past their read timeout."""
        late = time.monotonic() - self.read_timeout_s
        with self._places:
            for request in [request for request, accepted in self._waiting.items() if accepted < late]:
                self._drop(request)

    def _drop(self, request: socket.socket) -> None:
        """Free ``request``'s place now; its thread's read returns and the thread ends (under ``_places``)."""
        del self._waiting[request]
        try:
            request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client is gone already

    def shutdown_request(self, request: Any) -> None:
        with self._places:
            self._waiting.pop(request, None)
            self._answering.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended early", client_address, exc_info=True)


def serve(host: str, port: int, token: str | None, *, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
          max_connections: int = DEFAULT_MAX_CONNECTIONS, fresh_s: float = DEFAULT_FRESH_S) -> ExporterServer:
    """Start serving on ``host:port`` (port 0: any free one) in a daemon thread; the server (``server_port``,
    ``shutdown()``). A :class:`TandemError` for settings it refuses (:func:`start_refusal`)."""
    refusal = start_refusal(host, addresses_of(host), token, read_timeout_s, max_connections, fresh_s)
    if refusal is not None:
        raise TandemError(refusal)
    _own_database_url()  # set but empty: refused before anything listens
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlaneCollector(fresh_s=fresh_s))
    server = ExporterServer((host, port), read_timeout_s, max_connections)
    server.set_app(guarded(make_wsgi_app(registry), token))
    threading.Thread(target=server.serve_forever, name="tandem-exporter", daemon=True).start()
    return server
