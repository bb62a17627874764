"""A Spark standalone cluster from the pyspark wheel: one master and its workers, started with ``spark-class``.

The wheel carries the standalone Master and Worker classes but not Spark's ``sbin/start-*.sh`` scripts, so each
daemon is ``spark-class org.apache.spark.deploy.master.Master`` / ``…worker.Worker`` in its own process group, with
its log, pid and work folders under one cluster folder (they would default to site-packages). A node whose
``spark_master`` is the master's ``spark://host:port`` runs its instances' drivers here (client mode) and their
executors on the workers; checkpoints, Delta tables and landing must be on storage every worker sees.

Each daemon is recorded with its PID, its start time and its host's identity (:mod:`tandem.host_identity`); ``down``
signals a recorded process group only while its leader is still that daemon (:func:`daemon_refusal`): on the host
that recorded it, started when recorded, running the daemon's class. A PID reused by another process, a record read
on another host or one without a start time is left alone, with a warning.

    python -m tandem.spark_cluster up   [--dir .tandem/spark-cluster] [--workers 2] [--cores 2] [--memory 2g]
    python -m tandem.spark_cluster down [--dir .tandem/spark-cluster]
    python -m tandem.spark_cluster status [--dir .tandem/spark-cluster]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tandem.host_identity import this_host_id
from tandem.messaging.server import free_port
from tandem.process_start import TOLERANCE_S, start_since_boot

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
STATE_FILE = "cluster.json"
log = logging.getLogger(__name__)


class SparkClusterError(RuntimeError):
    """A daemon did not come up (the message carries its log's last lines)."""


@dataclass
class Daemon:
    """One daemon of the cluster: the leader of its own process group, ``started_at`` seconds from boot
    (:func:`tandem.process_start.start_since_boot`) on the host of identity ``host_id``."""

    name: str
    pid: int
    log: str
    started_at: float | None = None
    host_id: str | None = None

    @property
    def main_class(self) -> str:
        return MASTER_CLASS if self.name == "master" else WORKER_CLASS


def daemon_refusal(daemon: Daemon, host_id: str | None, started_at: float | None, leads_group: bool,
                   cmdline: list[str]) -> str | None:
    """Why the recorded ``daemon``'s process group must not be signalled, or ``None``: it is the daemon's (pure).

    ``host_id``: this host's identity; ``started_at``, ``leads_group``, ``cmdline``: what the process with the
    recorded PID is now (``started_at`` ``None``: there is none).
    """
    where = f"{daemon.name} (pid {daemon.pid})"
    if daemon.started_at is None:
        return f"{where} was recorded without its start time: it cannot be told from a process that reuses its PID"
    if daemon.host_id and daemon.host_id != host_id:
        return f"{where} was recorded on another host ({daemon.host_id}; this one is {host_id})"
    if started_at is None:
        return f"{where} is gone"
    if abs(started_at - daemon.started_at) > TOLERANCE_S:
        return f"{where} is gone: its PID is another process's now (started at {started_at:.2f} s from boot, not " \
               f"{daemon.started_at:.2f})"
    if not leads_group:
        return f"{where}: the process with its PID no longer leads its own process group"
    if daemon.main_class not in cmdline:
        return f"{where}: the process with its PID does not run {daemon.main_class}: {' '.join(cmdline)[:200]!r}"
    return None


@dataclass
class StandaloneCluster:
    """A running cluster: its master URL, web UI and daemons (recorded in ``<folder>/cluster.json``)."""

    folder: str
    master_url: str
    web_url: str
    daemons: list[Daemon] = field(default_factory=list)

    def worker(self, index: int) -> Daemon:
        return [d for d in self.daemons if d.name.startswith("worker")][index]

    def status(self) -> dict:
        """The master's JSON status page: ``workers`` (state, cores used), ``activeapps``, …"""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        """Workers the master counts ALIVE."""
        return sum(w["state"] == "ALIVE" for w in self.status()["workers"])


def spark_class() -> str:
    """The wheel's ``bin/spark-class``."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.is_file():
        raise SparkClusterError(f"{path} is missing: is pyspark installed from its wheel?")
    return str(path)


def _start(name: str, argv: list[str], folder: Path, env: dict[str, str], prefix: list[str]) -> Daemon:
    log = folder / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen([*prefix, spark_class(), *argv], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return Daemon(name, process.pid, str(log), start_since_boot(process.pid), this_host_id())


def _wait_for(what: str, ready, timeout_s: float, logs: list[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    tails = "\n".join(f"--- {log} ---\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-15:])
                      for log in logs if Path(log).is_file())
    raise SparkClusterError(f"{what} not ready after {timeout_s:g} s\n{tails}")


def start_cluster(folder: Path | str, *, workers: int = 2, cores: int = 2, memory: str = "2g",
                  host: str = "127.0.0.1", port: int | None = None, web_port: int | None = None,
                  worker_hosts: list[str] | None = None, prefix: list[str] | None = None,
                  worker_prefixes: list[list[str]] | None = None, timeout_s: float = 120.0) -> StandaloneCluster:
    """Start a master on ``host`` and ``workers`` workers (``cores`` and ``memory`` each, on ``worker_hosts[i]``,
    default ``host``), wait until the master counts them ALIVE. Each daemon binds its own address
    (``SPARK_LOCAL_IP``). ``port``/``web_port``: free ones of ``host`` when not given. ``prefix``: put before the
    master's command (``worker_prefixes[i]`` before worker ``i``'s; default ``prefix``), e.g. a multi-host
    harness's ``ip netns exec <host> …``."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    web_port = web_port or free_port(host)
    env = {**os.environ, "SPARK_LOG_DIR": str(folder / "logs"), "SPARK_PID_DIR": str(folder / "run"),
           "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    master_url, web_url = f"spark://{host}:{port}", f"http://{host}:{web_port}"
    cluster = StandaloneCluster(str(folder), master_url, web_url)
    cluster.daemons.append(_start("master", [MASTER_CLASS, "--host", host, "--port", str(port), "--webui-port",
                                             str(web_port)], folder, {**env, "SPARK_LOCAL_IP": host}, prefix or []))
    try:
        _wait_for("the Spark master", lambda: cluster.alive_workers() >= 0, timeout_s, [cluster.daemons[0].log])
        for index in range(workers):
            work_dir = folder / f"worker-{index + 1}"
            work_dir.mkdir(exist_ok=True)
            address = worker_hosts[index] if worker_hosts else host
            argv = [WORKER_CLASS, "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir),
                    "--webui-port", "0", "--host", address, master_url]
            cluster.daemons.append(_start(f"worker-{index + 1}", argv, folder, {**env, "SPARK_LOCAL_IP": address},
                                          worker_prefixes[index] if worker_prefixes else prefix or []))
        _wait_for(f"{workers} Spark worker(s)", lambda: cluster.alive_workers() >= workers, timeout_s,
                  [d.log for d in cluster.daemons])
    except BaseException:
        stop_cluster(cluster)
        raise
    (folder / STATE_FILE).write_text(json.dumps(asdict(cluster), indent=1))
    return cluster


def load_cluster_state(folder: Path | str) -> StandaloneCluster | None:
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return StandaloneCluster(data["folder"], data["master_url"], data["web_url"],
                             [Daemon(**d) for d in data["daemons"]])


def _refusal(daemon: Daemon, *, exec_window_s: float = 1.0) -> str | None:
    """:func:`daemon_refusal` of the process with the daemon's PID now; an empty command line (``spark-class``
    execs ``java`` in the same process) is read again for up to ``exec_window_s``."""
    started = start_since_boot(daemon.pid)
    deadline = time.monotonic() + exec_window_s
    while True:
        try:
            with open(f"/proc/{daemon.pid}/cmdline", "rb") as handle:
                cmdline = [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
            leads = os.getpgid(daemon.pid) == daemon.pid
        except (OSError, ProcessLookupError):
            cmdline, leads, started = [], False, None
        if cmdline or started is None or time.monotonic() >= deadline:
            return daemon_refusal(daemon, this_host_id(), started, leads, cmdline)
        time.sleep(0.05)


def stop_daemon(daemon: Daemon, sig: int = signal.SIGTERM, wait_s: float = 15.0) -> None:
    """Signal the daemon's process group, once verified (:func:`daemon_refusal`); KILL it when it outlives
    ``wait_s``. A group that is not the daemon's any more is left alone (a warning says why, unless it is gone)."""
    _reap(daemon.pid)
    if start_since_boot(daemon.pid) is None:  # gone: nothing to stop
        return
    refusal = _refusal(daemon)
    if refusal is not None:
        log.warning("not signalling the Spark %s", refusal)
        return
    try:
        os.killpg(daemon.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        _reap(daemon.pid)
        try:
            os.killpg(daemon.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(daemon.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect the daemon's exit when this process started it: a zombie still counts as its process group."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child, or already collected
        pass


def stop_cluster(cluster: StandaloneCluster) -> None:
    """Workers first (their executors go with them), then the master."""
    for daemon in reversed(cluster.daemons):
        stop_daemon(daemon)
    state = Path(cluster.folder) / STATE_FILE
    state.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=Path(".tandem/spark-cluster"), help="logs, pids, work folders")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="cores each worker offers")
    parser.add_argument("--memory", default="2g", help="memory each worker offers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7077)
    args = parser.parse_args(argv)
    running = load_cluster_state(args.dir)
    if args.action == "down":
        if running:
            stop_cluster(running)
            print(f"stopped the cluster of {args.dir}")
        else:
            print(f"no cluster recorded in {args.dir}")
        return 0
    if args.action == "status" or running:
        if not running:
            print(f"no cluster recorded in {args.dir}")
            return 1
        try:
            alive = running.alive_workers()
        except OSError as exc:
            print(f"{running.master_url}: master not answering ({exc}); 'down' clears the record")
            return 1
        print(f"{running.master_url} (UI {running.web_url}): {alive} worker(s) ALIVE; logs in {args.dir}/logs")
        return 0
    cluster = start_cluster(args.dir, workers=args.workers, cores=args.cores, memory=args.memory, host=args.host,
                            port=args.port)
    print(f"{cluster.master_url} (UI {cluster.web_url}): {args.workers} worker(s) × {args.cores} cores; give a node "
          f"spark_master: {cluster.master_url} in conf/cluster.yaml; stop with make spark-cluster-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
