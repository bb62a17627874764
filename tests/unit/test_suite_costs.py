"""The suite's cost plugin (tests/support/_costs.py): its pure parts and its CPU accounting of real processes."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import _costs


def _run(modules: dict) -> dict:
    return {"finished": "2026-12-07T10:00:00Z", "host": "2 x Test CPU", "workers": 2, "elapsed_s": 600.0,
            "modules": modules, "fixtures": [{"module": "a.py", "fixture": "stack (module)", "setups": 1,
                                              "wall_s": 40.0, "cpu_s": 30.0}]}


def _module(wall: float, cpu: float, jvms: int = 0, starts: dict | None = None) -> dict:
    return {"tests": 3, "wall_s": wall, "cpu_s": cpu, "failed": 0, "jvms": jvms,
            "phases": {"setup": 0, "call": wall, "teardown": 0}, "starts": starts or {}}


def test_a_module_is_heavy_when_it_keeps_more_than_a_core_busy_for_a_minute() -> None:
    run = _run({"a.py": _module(100, 130), "b.py": _module(100, 110), "c.py": _module(50, 100)})
    assert _costs.heavy_modules(run) == ["a.py"]


def test_the_table_lists_the_costliest_first_with_their_starts() -> None:
    run = _run({"small.py": _module(5, 1), "big.py": _module(300, 200, jvms=4,
                                                             starts={"airflow stack": 1, "airflow dags test": 2,
                                                                     "failover": 5})})
    table = _costs.readme_table(run)
    assert table.startswith(_costs.TABLE_START) and table.endswith(_costs.TABLE_END)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows[0] == "| `big.py` | 3 | 300 | 200 | 4 | 3 | 5 |"
    assert rows[1] == "| `small.py` | 3 | 5 | 1 | 0 | 0 | 0 |"
    assert "4 Spark JVMs started" in table and "3 Airflow starts" in table and "5 failovers" in table


def test_starts_are_counted_per_module_of_the_test_that_made_them(tmp_path) -> None:
    log = tmp_path / "starts.log"
    log.write_text("airflow stack\ttests/e2e/test_x.py::test_a (setup)\n"
                   "airflow dags test\ttests/e2e/test_x.py::test_b (call)\n"
                   "airflow stack\t\n")
    assert _costs.read_starts(log) == {"e2e/test_x.py": {"airflow stack": 1, "airflow dags test": 1},
                                       "(outside a test)": {"airflow stack": 1}}


def _busy(seconds: float) -> list[str]:
    return ["python3", "-c", f"import time\nend = time.process_time() + {seconds}\n"
                             "while time.process_time() < end: pass"]


def test_the_cpu_of_a_reaped_child_counts_in_the_tree() -> None:
    before = _costs.process_tree_cpu()
    subprocess.run(_busy(0.5), check=True)
    assert _costs.process_tree_cpu() - before >= 0.45


def test_the_cpu_of_a_detached_process_counts_when_it_carries_the_mark(monkeypatch) -> None:
    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(_costs._MARK, mark)
    detached = _costs.DetachedCpu(mark, interval=0.2)
    try:  # a double fork: the busy grandchild is reparented away from this process's tree
        subprocess.run(["bash", "-c", f"({shlex.join(_busy(1.0))} &)"], check=True)
        deadline = time.monotonic() + 20
        while detached.total < 0.8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert detached.total >= 0.8
    finally:
        detached.close()
