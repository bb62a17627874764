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

What it does not do:
    It keeps no history (Prometheus does) and never writes to the coordination database. One scrape at a time
    reads; another waits for it.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import TandemError
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.monitoring import samples as sampled
from tandem.monitoring.catalog import METRICS
from tandem.monitoring.reasons import reason_class
from tandem.monitoring.tally import Tally
from tandem.presenter import configuration, views
from tandem.presenter.cache import VersionedCache
from tandem.presenter.connections import TimedDatabase
from tandem.store import monitoring as readings

log = logging.getLogger(__name__)
DEFAULT_PORT = 9464
"""The port ``tandem exporter`` listens on unless told (the range Prometheus' wiki keeps for exporters)."""
STATEMENT_TIMEOUT_S = 10.0
TOKEN_VARIABLE = "TANDEM_EXPORTER_TOKEN"

QUARANTINE_COUNTS: VersionedCache[dict[tuple[str, str], int]] = VersionedCache(ttl_s=10.0)


def quarantine_counts(cluster: ClusterConfig, plan: PlanConfig) -> dict[tuple[str, str], int]:
    """Rows of the plan's quarantine table per (instance, reason class), read again when its Delta version moved."""
    path = delta_table_dir(cluster, plan.name, "quarantine")
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


@dataclass(eq=False)
class PlaneCollector:
    """The collector the exporter's registry asks on every scrape."""

    db: TimedDatabase | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    failovers: Tally | None = None
    published: Tally | None = None

    def describe(self) -> list[Metric]:
        return []  # the registry does not scrape at registration

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            started = time.monotonic()
            values = sampled.Samples()
            try:
                self._read(values)
                up = 1
            except Exception as exc:  # noqa: BLE001 - whatever fails, the scrape answers tandem_up 0 and says why
                log.warning("scrape failed: %s", " ".join(str(exc).split())[:500])
                values, up = sampled.Samples(), 0
            values.add("tandem_up", up)
            values.add("tandem_scrape_duration_seconds", time.monotonic() - started)
            yield from families(values)

    def _database(self, url: str) -> TimedDatabase:
        if self.db is None or self.db.url != url:
            if self.db is not None:
                self.db.close()
            self.db = TimedDatabase(url, "tandem-exporter", STATEMENT_TIMEOUT_S)
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
        db = self._database(cluster.database_url)
        for name in configuration.broken():
            sampled.add_broken_plan(values, name)
        for plan in plans.values():
            sampled.add_plan(values, plan, views.plan_status(db, cluster, plan))
            sampled.add_quarantine(values, plan.name, plan.instances, quarantine_counts(cluster, plan))
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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug(format, *args)


def serve(host: str, port: int, token: str | None) -> ThreadingWSGIServer:
    """Start serving on ``host:port`` (port 0: any free one) in a daemon thread; the server (``server_port``,
    ``shutdown()``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlaneCollector())
    server = make_server(host, port, guarded(make_wsgi_app(registry), token), ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="tandem-exporter", daemon=True).start()
    return server
