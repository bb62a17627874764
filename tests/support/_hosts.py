"""Hosts made of Linux network namespaces on this one machine, for the multi-host tests (run as root).

Each host is a network namespace (``ip netns``) with its own loopback and one veth link into a
bridge in the root namespace; the test process reaches every host through the bridge's own
address. Processes started on a host run inside its namespace and under its own host name (a
UTS namespace made by ``unshare --uts``), so Tandem records them as running on that host and never
signals them from another one. The filesystem is shared: it plays the part of the NFS mount that a
real deployment shares between hosts (README, "Deploying on several hosts").

Failures, with real kernel mechanisms:

- :meth:`HostNetwork.crash`: every process of the host killed at once (``SIGKILL``), as a power cut;
- :meth:`HostNetwork.isolate` / :meth:`HostNetwork.reconnect`: the host's link to the bridge down
  (its processes keep running, nothing reaches them, they reach nothing);
- :meth:`HostNetwork.cut` / :meth:`HostNetwork.mend`: blackhole routes between two hosts only;
- :meth:`HostNetwork.cut_address` / :meth:`HostNetwork.mend_address`: one host cut off from one address of
  another (a service listening there alone, :meth:`HostNetwork.add_address`).

A host may be pinned to its own CPUs (``cpus``, ``taskset``), so that a benchmark measures hosts
that do not share cores.

:meth:`HostNetwork.down` kills every process left in the namespaces and removes the namespaces and
the bridge (the veth pairs go with them); it is safe to call more than once and after a failed
:meth:`HostNetwork.up`. Addresses come from 10.213.N.0/24 and names from ``tdm<N>``, with N the
first bridge number free on this machine, so parallel runs do not meet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from _costs import note_start
from _ha import REPO, Pair, PrivatePostgres, db_now
from _project import note_failovers
from tandem.airflow_rest import AirflowClient
from tandem.supervisor import LaunchedJob
from tandem.config import load_cluster
from tandem.supervisor.launcher import LaunchError
from tandem.supervisor.stopping import StopResult, stop_instance
from tandem.supervisor.node_actions import NodeLaunch

SUBNET_PREFIX = "10.213"
BRIDGE_OCTET = 254


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    name: str  # the host name its processes see (socket.gethostname())
    namespace: str
    address: str
    link: str  # the veth end in the root namespace, plugged into the bridge


class HostNetwork:
    """Named hosts joined by one bridge; see the module docstring."""

    def __init__(self, names: list[str], cpus: dict[str, str] | None = None) -> None:
        """``cpus``: per host, the CPUs its processes may use (``taskset -c`` list, e.g. ``"0"``)."""
        self.names = list(names)
        self.cpus = dict(cpus or {})
        self.number: int | None = None
        self.hosts: dict[str, Host] = {}
        self.cuts: set[tuple[str, str]] = set()

    @property
    def bridge(self) -> str:
        return f"tdm{self.number}br"

    @property
    def bridge_address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.number}.{BRIDGE_OCTET}"

    def _claim_bridge(self) -> None:
        for number in range(1, 200):
            if _ip("link", "add", f"tdm{number}br", "type", "bridge", check=False).returncode == 0:
                self.number = number
                return
        raise RuntimeError("no free tdm<N>br bridge name between 1 and 199")

    def up(self) -> "HostNetwork":
        """Create the bridge and one namespace per host, each with its address and loopback up."""
        self._claim_bridge()
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index, name in enumerate(self.names, start=1):
            host = Host(name, f"tdm{self.number}-{name}", f"{SUBNET_PREFIX}.{self.number}.{index}",
                        f"tdm{self.number}v{index}")
            self.hosts[name] = host
            _ip("netns", "add", host.namespace)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        self.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            f"{host.address} {host.name}\n" for host in self.hosts.values()))
        return self

    def address(self, name: str) -> str:
        return self.hosts[name].address

    @property
    def hosts_file(self) -> Path:
        return Path(f"/tmp/tdm{self.number}-hosts")

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` as run on host ``name``: inside its namespace, under its host name, with an
        ``/etc/hosts`` that names every host (bind-mounted in a private mount namespace)."""
        host = self.hosts[name]
        pinned = ["taskset", "-c", self.cpus[name]] if name in self.cpus else []
        return ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "--mount", "--", *pinned,
                "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"',
                host.name, str(self.hosts_file), *argv]

    def popen(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` on host ``name`` in its own session, output appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as output:
            return subprocess.Popen(self.command(name, argv), stdin=subprocess.DEVNULL, stdout=output,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)

    def run(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout_s: float = 300) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``name`` to its end (its detached children stay on the host)."""
        return subprocess.run(self.command(name, argv), capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout_s)

    def pids(self, name: str) -> list[int]:
        """Every process running on host ``name`` (in its network namespace)."""
        done = _ip("netns", "pids", self.hosts[name].namespace, check=False)
        return [int(pid) for pid in done.stdout.split()]

    def crash(self, name: str) -> int:
        """Kill every process of host ``name`` at once with SIGKILL (a power cut); return how many there were."""
        pids = self.pids(name)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while self.pids(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(pids)

    def isolate(self, name: str) -> None:
        """Partition host ``name`` from every other host (both ends of its link down; its processes keep
        running, loopback included); returns once the host's own end reports no link."""
        host = self.hosts[name]
        _ip("link", "set", host.link, "down")
        _ip("-n", host.namespace, "link", "set", "eth0", "down")
        if not self.isolated(name):
            raise RuntimeError(f"{name} still has a link after isolating it: {self.link_state(name)}")

    def reconnect(self, name: str) -> None:
        host = self.hosts[name]
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("link", "set", host.link, "up")

    def link_state(self, name: str) -> str:
        """Both ends of the host's link, as ``ip -brief`` shows them (for messages)."""
        host = self.hosts[name]
        inside = _ip("-n", host.namespace, "-brief", "link", "show", "eth0", check=False).stdout.strip()
        outside = _ip("-brief", "link", "show", host.link, check=False).stdout.strip()
        return f"{inside} | {outside}"

    def isolated(self, name: str) -> bool:
        """Whether the host's own end of its link is down."""
        host = self.hosts[name]
        state = _ip("-n", host.namespace, "-o", "link", "show", "eth0").stdout
        return "state DOWN" in state or "NO-CARRIER" in state or ",UP" not in state

    def cut(self, a: str, b: str) -> None:
        """Partition hosts ``a`` and ``b`` from each other only (both still reach every other host)."""
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.hosts[here].namespace, "route", "add", "blackhole", f"{self.address(there)}/32")
        self.cuts.add((a, b))

    def mend(self, a: str, b: str) -> None:
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.hosts[here].namespace, "route", "del", "blackhole", f"{self.address(there)}/32",
                check=False)
        self.cuts.discard((a, b))

    def add_address(self, name: str, octet: int) -> str:
        """A second address of host ``name`` (``10.213.N.<octet>``): a service listening on it alone can be cut off
        from a host by itself (:meth:`cut_address`), the host's other services still reachable."""
        address = f"{SUBNET_PREFIX}.{self.number}.{octet}"
        _ip("-n", self.hosts[name].namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        return address

    def cut_address(self, name: str, address: str) -> None:
        """Host ``name`` reaches nothing at ``address`` any more (a blackhole route; undone by :meth:`mend_address`
        or when the hosts go down)."""
        _ip("-n", self.hosts[name].namespace, "route", "add", "blackhole", f"{address}/32")

    def mend_address(self, name: str, address: str) -> None:
        _ip("-n", self.hosts[name].namespace, "route", "del", "blackhole", f"{address}/32", check=False)

    def down(self) -> None:
        """Kill what runs on the hosts, remove the namespaces and the bridge (idempotent)."""
        for name, host in self.hosts.items():
            if _ip("netns", "pids", host.namespace, check=False).returncode == 0:
                self.crash(name)
                _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)  # normally gone with its namespace
        if self.number is not None:
            _ip("link", "del", self.bridge, check=False)
            self.hosts_file.unlink(missing_ok=True)
        self.hosts.clear()
        self.cuts.clear()

    def __enter__(self) -> "HostNetwork":
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc_info) -> None:
        self.down()


HOST_OF = {"node-a": "host-a", "node-b": "host-b"}
"""Where each node of the trades plan runs in the multi-host tests and benchmark."""
BACKUP_NODE, BACKUP_HOST = "node-c", "host-c"
"""The third node (BACKUP) and its host, where a test adds it (:func:`add_backup_node`)."""


def add_backup_node(project: Path) -> None:
    """:data:`BACKUP_NODE` in the temp project: a node of ``cluster.yaml`` (local[1], as the others)
    and the trades plan's third node, so its initial role is BACKUP."""
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    cluster["nodes"][BACKUP_NODE] = {"spark_master": "local[1]", "driver_memory": "1g"}
    cluster_path.write_text(yaml.safe_dump(cluster))
    plan_path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(plan_path.read_text())
    plan["nodes"] = [*plan["nodes"], BACKUP_NODE]
    plan_path.write_text(yaml.safe_dump(plan))


def _cli_on_host(network: HostNetwork, host: str, argv: list[str], local_ip: str = "127.0.0.1") -> dict:
    """``tandem <argv> --json`` run on ``host``; its JSON line. ``local_ip``: the address its Spark drivers bind
    (the host's own when executors on other hosts must reach them)."""
    done = network.run(host, [sys.executable, "-m", "tandem.cli", *argv, "--json"],
                       env={**os.environ, "SPARK_LOCAL_IP": local_ip}, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"tandem {argv[0]} on {host} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def launch_on_host(network: HostNetwork, host: str, plan: str, instance: str, node: str, role: str,
                   trigger: str | None = None, resync_from: str | None = None, replace: bool = False,
                   local_ip: str = "127.0.0.1") -> NodeLaunch:
    """``tandem launch`` run on ``host``: the re-sync and the instance's ``spark-submit`` happen there."""
    argv = ["launch", plan, instance, node, "--role", role]
    argv += ["--trigger-interval", trigger] if trigger else []
    argv += ["--resync-from", resync_from] if resync_from else []
    argv += ["--replace"] if replace else []
    job = _cli_on_host(network, host, argv, local_ip)
    return NodeLaunch(LaunchedJob(job["instance_id"], job["reused"], job["reason"], job["status"], job["submit_pid"],
                                  None, None, job["log_path"]), job["cut"])


@dataclass(frozen=True)
class CliOnHosts:
    """The supervisor's :class:`~tandem.supervisor.node_actions.NodeHost` without Airflow: ``tandem launch
    --replace`` runs on each node's host (as its worker would run it); a stop goes through PostgreSQL
    from here, and ``tandem stop`` runs on the node's host only for a driver that beats but does not
    obey (as :class:`tandem.airflow.node_launch.NodeQueue` does)."""

    network: HostNetwork
    plan: str

    def launch(self, instance: str, node: str, role: str, resync_from: str | None) -> NodeLaunch:
        return launch_on_host(self.network, HOST_OF[node], self.plan, instance, node, role, resync_from=resync_from,
                              replace=True)

    def stop(self, instance: str, node: str, timeout_s: float) -> StopResult:
        try:
            return stop_instance(load_cluster(), self.plan, instance, node, timeout_s=timeout_s)
        except LaunchError:
            return StopResult(**_cli_on_host(self.network, HOST_OF[node],
                                             ["stop", self.plan, instance, node, "--timeout", str(timeout_s)]))


@dataclass
class HostPair(Pair):
    """A :class:`Pair` whose nodes are launched on their own hosts (:func:`launch_on_host`)."""

    network: HostNetwork | None = None
    host_of: dict[str, str] = field(default_factory=lambda: dict(HOST_OF))
    drivers_on_host_address: bool = False
    """Drivers bind their host's address instead of 127.0.0.1: executors on other hosts (a Spark cluster) must
    reach them."""

    def launch(self, node: str, role: str) -> int:
        host = self.host_of[node]
        local_ip = self.network.address(host) if self.drivers_on_host_address else "127.0.0.1"
        job = launch_on_host(self.network, host, self.plan.name, self.instance, node, role, self.trigger,
                             local_ip=local_ip).job
        assert not job.reused, f"{node}: the launcher reused a job instead of launching: {job.reason}"
        self.groups.append(job.submit_pid)
        self.pgids[node] = job.submit_pid
        self.launched_at[node] = db_now(self.url)
        return job.submit_pid


@contextmanager
def hosts_with_postgres(root: Path, names: list[str], cpus: dict[str, str] | None = None
                        ) -> Iterator[tuple[HostNetwork, PrivatePostgres, str]]:
    """The hosts ``control`` + ``names`` up, a private PostgreSQL on the control host's address (port
    5432 of that namespace); yields the network, the server and its ``tandem`` database URL. The
    server is removed and the hosts taken down afterwards, whatever happened."""
    network = HostNetwork(["control", *names], cpus)
    server: PrivatePostgres | None = None
    url = ""
    try:
        network.up()
        server = PrivatePostgres(root / "pg", 5432, listen=network.address("control"),
                                 on_host=lambda argv: network.command("control", argv))
        url = server.start()
        yield network, server, url
    finally:
        if server is not None:
            if url:
                note_failovers(url)
            server.destroy()
        network.down()


EDGE_EXECUTORS = "LocalExecutor,airflow.providers.edge3.executors.EdgeExecutor"
AIRFLOW_PORT = 8080  # every host has its own network stack: no test on this machine competes for it


@dataclass
class AirflowOnHosts:
    """Airflow on the control host (API server, scheduler, triggerer, DAG processor; metadata in the
    control host's PostgreSQL) and an Edge worker on each node's host that serves the node's queue.

    Every host sources the same ``env_file`` (``.tandem/env.sh`` of the code under test) with the
    ``TANDEM_AIRFLOW_*`` settings of a several-host deployment, as an operator would on real hosts.
    """

    network: HostNetwork
    env_file: Path
    home: Path
    metadata_url: str
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    schedulers: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.network.address('control')}:{AIRFLOW_PORT}"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({"TANDEM_ENV_FILE": str(self.env_file), "TANDEM_AIRFLOW_HOME": str(self.home),
                    "TANDEM_AIRFLOW_PORT": str(AIRFLOW_PORT), "TANDEM_AIRFLOW_HOST": "0.0.0.0",
                    "TANDEM_AIRFLOW_URL": self.url, "TANDEM_AIRFLOW_EXECUTOR": EDGE_EXECUTORS,
                    "TANDEM_AIRFLOW_DB_URL": self.metadata_url, "SPARK_LOCAL_IP": "127.0.0.1",
                    # a crashed host's worker is UNKNOWN after 5 missed heartbeats: 20 s, not 50 s
                    "AIRFLOW__EDGE__HEARTBEAT_INTERVAL": "4"})
        return env

    def start(self) -> AirflowClient:
        """The four Airflow components up on the control host; a client logged in as admin."""
        note_start("airflow stack")
        done = self.network.run("control", ["bash", str(REPO / "scripts" / "airflow_stack.sh"), "up"],
                                env=self.environment(), timeout_s=600)
        if done.returncode != 0:
            raise RuntimeError(f"the Airflow stack did not start on the control host:\n{done.stdout}\n{done.stderr}")
        return AirflowClient.as_admin(self.url, airflow_home=self.home)

    def start_worker(self, host: str, queue: str, timeout_s: float = 120) -> None:
        """An Edge worker on ``host`` (named after it) serving ``queue``, as a node's host runs it.

        A host back from a crash finds its old worker still registered until Airflow marks it
        UNKNOWN (no heartbeat for 5 heartbeat intervals) and is refused as a duplicate until then:
        like a service manager, this starts it again until it stays up."""
        script = ('. "$TANDEM_ENV_FILE" && exec airflow edge worker --queues "$0" --edge-hostname "$1" '
                  '--pid "$2" --concurrency 4')
        pid_file = self.home / "run" / f"edge-worker-{host}.pid"
        log = self.worker_log(host)
        deadline = time.monotonic() + timeout_s
        while True:
            pid_file.unlink(missing_ok=True)  # a crashed host leaves its pid file behind
            offset = log.stat().st_size if log.exists() else 0
            note_start("airflow edge worker")
            process = self.network.popen(host, ["bash", "-c", script, queue, host, str(pid_file)], log,
                                         env=self.environment())
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.workers[host] = process  # registered and polling for jobs
                return
            with open(log, "rb") as output:
                output.seek(offset)
                text = output.read().decode(errors="replace")
            if "is already active" not in text or time.monotonic() > deadline:
                raise RuntimeError(f"the Edge worker on {host} exited ({process.returncode}):\n{text[-3000:]}")
            time.sleep(3)

    def start_scheduler(self, host: str) -> subprocess.Popen:
        """A second scheduler on ``host`` (Airflow's scheduler HA: both lock rows of the same metadata
        database), with its own LocalExecutor for the tasks it schedules."""
        note_start("airflow scheduler")
        process = self.network.popen(host, ["bash", "-c", '. "$TANDEM_ENV_FILE" && exec airflow scheduler'],
                                     self.home / "logs" / f"scheduler-{host}.log", env=self.environment())
        self.schedulers[host] = process
        return process

    def kill_control_scheduler(self) -> int:
        """``kill -9`` of the control host's scheduler and its process group (its executor's workers); its pid."""
        pid = int((self.home / "run" / "scheduler.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        return pid

    def worker_log(self, host: str) -> Path:
        return self.home / "logs" / f"edge-worker-{host}.log"

    def stop_control(self) -> None:
        """Stop Airflow's four components on the control host (the workers stay up)."""
        done = subprocess.run(["bash", str(REPO / "scripts" / "airflow_stack.sh"), "down"],
                              env=self.environment(), capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"the Airflow stack did not stop:\n{done.stdout}\n{done.stderr}")

    def stop(self) -> None:
        """Stop the workers, the extra schedulers and the stack (the hosts' teardown kills whatever is left)."""
        for process in [*self.workers.values(), *self.schedulers.values()]:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)
        subprocess.run(["bash", str(REPO / "scripts" / "airflow_stack.sh"), "down"], env=self.environment(),
                       capture_output=True, timeout=180)
