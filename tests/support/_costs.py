"""Where the suite's time goes: a pytest plugin that measures every module, test and fixture.

Per test phase (setup, call, teardown) it takes the wall seconds pytest reports and the CPU seconds of the
worker's whole process tree (the worker, its Spark JVM, and every driver, ``spark-submit``, Airflow component
and server it started, running or already reaped). Per fixture it takes the wall and CPU seconds of its setup
(its teardown counts in the phase it runs in). It also counts what the suite starts: Spark JVMs (a driver each, or an
in-process session), through a JVM option in ``SPARK_SUBMIT_OPTS`` that every JVM the worker starts inherits and
that writes a small file per JVM; and Airflow (stacks, ``dags test`` runs, Edge workers, migrations), noted by
the test helpers that start it (:func:`note_start`).

At the end of a run it prints the costliest modules and fixtures and writes everything to
``.tandem/test-costs.json``; ``python tests/support/_costs.py`` turns that file into the table of
``tests/README.md`` and ``tests/module_seconds.json``, which the scheduler (``tests/conftest.py``) reads.
Under xdist the workers measure and the controller adds up (the values travel in ``user_properties``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COSTS_FILE = REPO / ".tandem" / "test-costs.json"
MODULE_SECONDS_FILE = REPO / "tests" / "module_seconds.json"
README = REPO / "tests" / "README.md"
_RUN_FOLDER = "TANDEM_TEST_COSTS_RUN"
_CPU_KEY = "tandem_cpu_s"
_JVMS_KEY = "tandem_jvms"
_JVM_LOG = "-Xlog:gc+init=info"
_FIXTURES_KEY = "tandem_fixtures"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_MARK = "TANDEM_TEST_COSTS_WORKER"  # inherited by everything a worker starts, detached or not
# bound at import: tests monkeypatch os.scandir and friends, and the plugin measures around them
_scandir, _listdir, _open = os.scandir, os.listdir, open


@dataclass
class ProcessTable:
    """One pass over ``/proc``: each process's parent and CPU seconds (its own, plus its reaped children's)."""

    children: dict[int, list[int]]
    parent: dict[int, int]
    cpu: dict[int, float]

    @classmethod
    def read(cls) -> ProcessTable:
        children: dict[int, list[int]] = defaultdict(list)
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in _scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with _open(f"/proc/{entry.name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:  # gone in between
                continue
            pid = int(entry.name)
            # after the command: state ppid … utime(12) stime(13) cutime(14) cstime(15), counting from state = 1
            parent[pid] = int(fields[1])
            children[parent[pid]].append(pid)
            cpu[pid] = sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS
        return cls(children, parent, cpu)

    def tree_cpu(self, root: int) -> float:
        """CPU seconds of ``root`` and all its descendants, live or reaped (their times roll up into the parent
        that waited for them)."""
        total, stack = 0.0, [root]
        while stack:
            pid = stack.pop()
            total += self.cpu.get(pid, 0.0)
            stack.extend(self.children.get(pid, ()))
        return total


def _own_cpu(pid: int) -> float:
    with _open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for thread in _listdir(f"/proc/{pid}/task"):
            with _open(f"/proc/{pid}/task/{thread}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
    except OSError:  # ended in between
        pass
    return found


def process_tree_cpu(root: int | None = None) -> float:
    """CPU seconds of a process and all its descendants, live or reaped (their times roll up into the parent
    that waited for them). Walks the tree only (``/proc/<pid>/task/<tid>/children``), not all of ``/proc``."""
    total, stack = 0.0, [os.getpid() if root is None else root]
    while stack:
        pid = stack.pop()
        try:
            total += _own_cpu(pid)
        except OSError:
            continue
        stack.extend(_children(pid))
    return total


def _marked_by(pid: int) -> str | None:
    try:
        with _open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    key = f"{_MARK}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode(errors="replace")
    return None


class DetachedCpu:
    """CPU seconds of what a worker started that left its process tree: a daemonized driver, an Airflow
    component, a server (reparented to PID 1 or a subreaper). Each carries the worker's mark in its environment;
    a thread samples them every ``interval`` seconds and keeps the last value seen of each detached subtree,
    so a process that ends between two samples loses at most its last ``interval`` of CPU."""

    def __init__(self, mark: str, interval: float = 2.0) -> None:
        self.mark = mark
        self.interval = interval
        self._last: dict[int, float] = {}
        self._marks: dict[int, str | None] = {}  # environ is fixed at exec: read it once per pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-costs", daemon=True)
        self._thread.start()

    def _is_marked(self, pid: int) -> bool:
        if pid not in self._marks:
            self._marks[pid] = _marked_by(pid)
        return self._marks[pid] == self.mark

    @property
    def total(self) -> float:
        """The detached CPU seconds as of the last sample (at most ``interval`` old)."""
        with self._lock:
            return sum(self._last.values())

    def sample(self) -> float:
        """Take a sample now; the detached CPU seconds so far."""
        table = ProcessTable.read()
        own_tree = set()
        stack = [os.getpid()]
        while stack:
            pid = stack.pop()
            own_tree.add(pid)
            stack.extend(table.children.get(pid, ()))
        with self._lock:
            for pid in list(self._marks):
                if pid not in table.cpu:
                    del self._marks[pid]  # gone: a new process may get its number
            for pid in table.cpu:
                if pid in own_tree or not self._is_marked(pid):
                    continue
                if self._is_marked(table.parent[pid]):
                    continue  # inside a detached subtree counted from its root
                self._last[pid] = max(self._last.get(pid, 0.0), table.tree_cpu(pid))
            return sum(self._last.values())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - measuring must never break a test run
                pass

    def close(self) -> None:
        self._stop.set()


def module_of(nodeid: str) -> str:
    """``tests/integration/test_x.py::test_y[1]`` -> ``integration/test_x.py``."""
    return nodeid.split("::", 1)[0].removeprefix("tests/")


def note_start(what: str, times: int = 1) -> None:
    """Note that a test started ``what`` (e.g. ``airflow stack``, or made a ``failover``): lines in the run's starts
    log."""
    folder = os.environ.get(_RUN_FOLDER)
    if folder and times > 0:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with _open(Path(folder) / "starts.log", "a") as log:
            log.write(f"{what}\t{os.environ.get('PYTEST_CURRENT_TEST', '')}\n" * times)


def count_jvms_into(folder: Path) -> None:
    """Make every JVM started from here on (they inherit ``SPARK_SUBMIT_OPTS``) write a file into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    options = [option for option in os.environ.get("SPARK_SUBMIT_OPTS", "").split() if not option.startswith(_JVM_LOG)]
    options.append(f"{_JVM_LOG}:file={folder}/jvm-%p.log")  # a few lines of the JVM's start, 0.5 kB
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(options)


def read_starts(log: Path) -> dict[str, dict[str, int]]:
    """Starts per module from the log of :func:`note_start`: ``{module: {"airflow stack": n, ...}}``."""
    starts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    if not log.exists():
        return {}
    for line in log.read_text(errors="replace").splitlines():
        what, current = (line.split("\t") + [""])[:2]
        starts[module_of(current.split(" ")[0]) if current else "(outside a test)"][what] += 1
    return {module: dict(counts) for module, counts in starts.items()}


@dataclass
class ModuleCost:
    tests: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    failed: int = 0
    jvms: int = 0
    phases: dict[str, float] = field(default_factory=lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0})


class SuiteCosts:
    """The plugin (registered by ``tests/conftest.py``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.is_worker = hasattr(config, "workerinput")
        if not self.is_worker:  # one folder per run, so that runs side by side keep their counts apart
            os.environ[_RUN_FOLDER] = str(REPO / ".tandem" / "test-costs" / f"run-{os.getpid()}")
        self.folder = Path(os.environ[_RUN_FOLDER])
        self.costs_file = Path(os.environ.get("TANDEM_TEST_COSTS_FILE", COSTS_FILE))
        self.starts_log = self.folder / "starts.log"
        self.modules: dict[str, ModuleCost] = defaultdict(ModuleCost)
        self.tests: dict[str, dict] = {}
        self.fixtures: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        self.started = time.monotonic()
        self._fixture_costs: list[list] = []
        if not self.is_worker:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.jvm_folder = self.folder / f"jvms-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
        count_jvms_into(self.jvm_folder)
        os.environ[_MARK] = f"{os.getpid()}"
        self.detached = DetachedCpu(os.environ[_MARK])

    def pytest_unconfigure(self) -> None:
        self.detached.close()

    # -- workers (or a run without xdist): measure --------------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        wall, cpu = time.monotonic(), self._cpu()
        yield
        self._fixture_costs.append([fixturedef.argname, fixturedef.scope,
                                    time.monotonic() - wall, self._cpu() - cpu])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        report.user_properties.append((_CPU_KEY, getattr(item, "_tandem_cpu", 0.0)))
        report.user_properties.append((_JVMS_KEY, getattr(item, "_tandem_jvms", 0)))
        if self._fixture_costs:  # set up in this phase (a fixture may also be asked for during the call)
            report.user_properties.append((_FIXTURES_KEY, self._fixture_costs))
        self._fixture_costs = []

    def _jvms(self) -> int:
        return len(_listdir(self.jvm_folder)) if self.jvm_folder.exists() else 0

    def _cpu(self) -> float:
        return process_tree_cpu() + self.detached.total

    def _measured(self, item):
        cpu, jvms = self._cpu(), self._jvms()
        yield
        item._tandem_cpu = self._cpu() - cpu
        item._tandem_jvms = self._jvms() - jvms

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._measured(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._measured(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._measured(item)

    # -- the controller (or a run without xdist): add up -----------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        module = self.modules[module_of(report.nodeid)]
        properties = dict(report.user_properties)
        cpu = float(properties.get(_CPU_KEY, 0.0))
        module.wall_s += report.duration
        module.cpu_s += cpu
        module.jvms += int(properties.get(_JVMS_KEY, 0))
        module.phases[report.when] += report.duration
        test = self.tests.setdefault(report.nodeid, {"wall_s": 0.0, "cpu_s": 0.0})
        test["wall_s"] += report.duration
        test["cpu_s"] += cpu
        if report.when == "call" or (report.when == "setup" and report.skipped):
            module.tests += 1
        if report.failed:
            module.failed += 1
        for name, scope, wall, cpu_s in properties.get(_FIXTURES_KEY, ()):
            cost = self.fixtures[(module_of(report.nodeid), f"{name} ({scope})")]
            cost[0] += 1
            cost[1] += wall
            cost[2] += cpu_s

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.is_worker or not self.modules:
            return
        starts = read_starts(self.starts_log)
        elapsed = time.monotonic() - self.started
        result = {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": host_description(),
            "workers": getattr(self.config.option, "numprocesses", None) or 0,
            "elapsed_s": round(elapsed, 1),
            "selection": " ".join(self.config.invocation_params.args),
            "modules": {name: {"tests": cost.tests, "wall_s": round(cost.wall_s, 1), "cpu_s": round(cost.cpu_s, 1),
                               "failed": cost.failed, "jvms": cost.jvms,
                               "phases": {k: round(v, 1) for k, v in cost.phases.items()},
                               "starts": starts.get(name, {})}
                        for name, cost in sorted(self.modules.items())},
            "fixtures": [{"module": module, "fixture": name, "setups": n, "wall_s": round(wall, 2),
                          "cpu_s": round(cpu, 2)}
                         for (module, name), (n, wall, cpu) in sorted(self.fixtures.items(),
                                                                       key=lambda kv: -kv[1][1])
                         if wall >= 0.5],
            "tests": {nodeid: {k: round(v, 2) for k, v in cost.items()}
                      for nodeid, cost in self.tests.items() if cost["wall_s"] >= 1.0},
        }
        self.costs_file.parent.mkdir(parents=True, exist_ok=True)
        self.costs_file.write_text(json.dumps(result, indent=1) + "\n")
        shutil.rmtree(self.folder, ignore_errors=True)
        write = terminalreporter.write_line
        terminalreporter.section("where the time went (tests/support/_costs.py)")
        for line in summary_lines(result, top=15):
            write(line)
        write(f"details: {self.costs_file}; tables for tests/README.md: python tests/support/_costs.py")


def host_description() -> str:
    """``2 x AMD EPYC 7B13`` from ``/proc/cpuinfo``."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        return "unknown"
    return f"{len(names)} x {names[0]}" if names else "unknown"


def _counts(module: dict) -> tuple[int, int, int]:
    """Spark JVMs, Airflow starts and failovers of a module."""
    return (module.get("jvms", 0), sum(n for what, n in module["starts"].items() if what.startswith("airflow")),
            module["starts"].get("failover", 0))


def summary_lines(result: dict, top: int = 10) -> list[str]:
    """The costliest modules and fixtures of a run, as text lines."""
    modules = sorted(result["modules"].items(), key=lambda kv: -kv[1]["wall_s"])
    total_wall = sum(m["wall_s"] for _, m in modules)
    total_cpu = sum(m["cpu_s"] for _, m in modules)
    drivers, airflow, failovers = (sum(_counts(m)[i] for _, m in modules) for i in range(3))
    lines = [f"{len(modules)} modules: {total_wall:.0f} s of test time, {total_cpu:.0f} CPU s, "
             f"{result['elapsed_s']:.0f} s elapsed on {result['workers'] or 1} worker(s); "
             f"{drivers} Spark JVMs started, {airflow} Airflow starts, {failovers} failovers",
             f"{'module':<48} {'tests':>5} {'wall s':>7} {'CPU s':>7} {'JVMs':>5} {'airflow':>7} {'failovers':>9}"]
    for name, cost in modules[:top]:
        d, a, f = _counts(cost)
        lines.append(f"{name:<48} {cost['tests']:>5} {cost['wall_s']:>7.0f} {cost['cpu_s']:>7.0f} {d:>5} {a:>7} "
                     f"{f:>9}")
    lines.append(f"{'fixture (setup only)':<60} {'setups':>6} {'wall s':>7} {'CPU s':>7}")
    for fixture in result["fixtures"][:top]:
        label = f"{fixture['module']} {fixture['fixture']}"
        lines.append(f"{label[:60]:<60} {fixture['setups']:>6} {fixture['wall_s']:>7.0f} {fixture['cpu_s']:>7.0f}")
    return lines


# -- tests/README.md and tests/module_seconds.json from the last full run ----------------------------------------
TABLE_START = "<!-- costs: generated by `python tests/support/_costs.py`; do not edit by hand -->"
TABLE_END = "<!-- costs: end -->"


def readme_table(result: dict, top: int = 10) -> str:
    """The markdown that goes between the markers of ``tests/README.md``."""
    modules = sorted(result["modules"].items(), key=lambda kv: -kv[1]["wall_s"])
    total_wall = sum(m["wall_s"] for _, m in modules)
    total_cpu = sum(m["cpu_s"] for _, m in modules)
    drivers, airflow, failovers = (sum(_counts(m)[i] for _, m in modules) for i in range(3))
    tests = sum(m["tests"] for _, m in modules)
    out = [TABLE_START, "",
           f"Measured {result['finished'][:10]} on {result['host']}, {result['workers'] or 1} worker(s): "
           f"{tests} tests in {len(modules)} modules, {result['elapsed_s'] / 60:.1f} min elapsed, "
           f"{total_wall:.0f} s of test time, {total_cpu:.0f} CPU s; {drivers} Spark JVMs started (drivers and "
           f"in-process sessions), {airflow} Airflow starts (stacks, `dags test` runs, Edge workers, migrations), "
           f"{failovers} failovers (a node taking the lease from another).", "",
           f"The {top} costliest modules (wall seconds of their tests' setup, call and teardown; CPU seconds of "
           "the worker's process tree):", "",
           "| module | tests | wall s | CPU s | Spark JVMs | Airflow starts | failovers |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, cost in modules[:top]:
        d, a, f = _counts(cost)
        out.append(f"| `{name}` | {cost['tests']} | {cost['wall_s']:.0f} | {cost['cpu_s']:.0f} | {d} | {a} | {f} |")
    out += ["", f"The {top} costliest fixture setups:", "",
            "| module | fixture (scope) | setups | wall s | CPU s |", "|---|---|---:|---:|---:|"]
    for fixture in result["fixtures"][:top]:
        out.append(f"| `{fixture['module']}` | `{fixture['fixture']}` | {fixture['setups']} | "
                   f"{fixture['wall_s']:.0f} | {fixture['cpu_s']:.0f} |")
    out += ["", TABLE_END]
    return "\n".join(out)


HEAVY_WALL_S = 60
HEAVY_CORES = 1.2


def heavy_modules(result: dict) -> list[str]:
    """Modules that kept more than ``HEAVY_CORES`` cores busy on average for ``HEAVY_WALL_S`` or more: two of them
    side by side starve each other on two cores (the scheduler never runs two at once)."""
    return sorted(name for name, cost in result["modules"].items()
                  if cost["wall_s"] >= HEAVY_WALL_S and cost["cpu_s"] >= HEAVY_CORES * cost["wall_s"])


def main(argv: list[str]) -> int:
    """Write the table of ``tests/README.md`` and ``tests/module_seconds.json`` from ``.tandem/test-costs.json``."""
    source = Path(argv[0]) if argv else COSTS_FILE
    if not source.exists():
        print(f"{source}: no measured run (run `make test` first)", file=sys.stderr)
        return 1
    result = json.loads(source.read_text())
    seconds = {name: round(cost["wall_s"]) for name, cost in
               sorted(result["modules"].items(), key=lambda kv: -kv[1]["wall_s"]) if cost["wall_s"] >= 5}
    MODULE_SECONDS_FILE.write_text(json.dumps({"measured": result["finished"], "host": result["host"],
                                               "seconds": seconds, "heavy": heavy_modules(result)},
                                              indent=1) + "\n")
    text = README.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    README.write_text(text[:start] + readme_table(result) + text[end:])
    print(f"wrote {MODULE_SECONDS_FILE.relative_to(REPO)} and the table of {README.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
