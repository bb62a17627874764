"""Background work yields the CPU: ``lower_priority`` lowers a driver and, under spark-submit, every thread of the
JVM that launched it (real processes; a Python parent with threads stands in for the JVM)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tandem.spark_session import BACKGROUND_NICENESS

pytestmark = pytest.mark.integration

PARENT = textwrap.dedent("""
    import os, subprocess, sys, threading
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    child = subprocess.run([sys.executable, "-c", sys.argv[1]], env={**os.environ, **dict([sys.argv[2:4]])})
    print(sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{os.getpid()}/task")}),
          child.returncode, flush=True)
    stop.set()
""")
DRIVER = "from tandem.spark_session import lower_priority; print(lower_priority())"


@pytest.mark.parametrize("under_spark_submit", [True, False])
def test_lower_priority_reaches_the_launching_jvm_only_under_spark_submit(under_spark_submit: bool) -> None:
    variable = "PYSPARK_GATEWAY_PORT" if under_spark_submit else "TANDEM_UNRELATED"
    done = subprocess.run([sys.executable, "-c", PARENT, DRIVER, variable, "1"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYSPARK_GATEWAY_PORT": ""})
    assert done.returncode == 0, done.stderr
    driver_niceness, parent = done.stdout.splitlines()
    assert int(driver_niceness) == BACKGROUND_NICENESS
    expected = [BACKGROUND_NICENESS] if under_spark_submit else [os.nice(0)]
    assert parent == f"{expected} 0"
