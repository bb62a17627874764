"""Structured logs (:mod:`tandem.logs`): the JSON formatter, its context, the setting, and a real process's stderr."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.errors import ConfigError
from tandem.logs import (CONTEXT_FIELDS, FORMAT_VARIABLE, JsonFormatter, batch_context, configure_logging,
                         current_context, log_context, log_format, set_epoch)
from tandem.supervisor.submit_command import DRIVER_ENVIRONMENT

PROJECT = Path(__file__).resolve().parents[2]
ISO_UTC_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def no_context() -> Iterator[None]:
    """The process-wide context is a global: every test starts and ends without one."""
    log_context()
    set_epoch(None)
    yield
    log_context()
    set_epoch(None)


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines into a buffer."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tandem.test_json_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, buffer
    logger.removeHandler(handler)


def lines(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_line_is_one_json_object_with_stable_keys(logged):
    logger, buffer = logged
    logger.warning("lag of %s is %d s", "trades", 12)
    (line,) = lines(buffer)
    assert ISO_UTC_MS.match(line["time"]), line["time"]
    assert (line["level"], line["logger"]) == ("WARNING", "tandem.test_json_logs")
    assert line["message"] == "lag of trades is 12 s"
    assert {name: line[name] for name in CONTEXT_FIELDS} == dict.fromkeys(CONTEXT_FIELDS)  # unknown: null, not absent
    assert "exception" not in line


def test_the_exception_text_is_its_own_field(logged):
    logger, buffer = logged
    try:
        raise ValueError("bad row")
    except ValueError:
        logger.exception("publish failed")
    (line,) = lines(buffer)
    assert line["message"] == "publish failed"
    assert "Traceback" in line["exception"] and "ValueError: bad row" in line["exception"]


def test_the_context_is_set_and_reset(logged):
    logger, buffer = logged
    log_context(plan="trades", instance="shard-1", node="node-a")
    set_epoch(7)
    with batch_context(41, "by_symbol"):
        logger.info("in the batch")
    logger.info("after it")
    set_epoch(None)
    logger.info("demoted")
    in_batch, after, demoted = lines(buffer)
    assert {name: in_batch[name] for name in CONTEXT_FIELDS} == {
        "plan": "trades", "instance": "shard-1", "node": "node-a", "epoch": 7, "batch": 41, "query": "by_symbol"}
    assert (after["batch"], after["query"], after["epoch"], after["instance"]) == (None, None, 7, "shard-1")
    assert demoted["epoch"] is None


def test_a_batch_belongs_to_its_thread_the_plan_to_the_process():
    log_context(plan="trades", instance="shard-1", node="node-a")
    seen: dict = {}
    with batch_context(3, "q"):
        thread = threading.Thread(target=lambda: seen.update(current_context()))
        thread.start()
        thread.join()
        assert current_context()["batch"] == 3
    assert (seen["plan"], seen["batch"]) == ("trades", None)


def test_an_extra_field_wins_and_what_json_cannot_hold_is_written_as_text(logged):
    logger, buffer = logged
    log_context(plan="trades", instance=Path("shard-1"))  # type: ignore[arg-type]
    logger.info("held %s", object(), extra={"node": "node-b", "batch": frozenset({1})})
    (line,) = lines(buffer)
    assert (line["node"], line["instance"], line["batch"]) == ("node-b", "shard-1", "frozenset({1})")
    assert line["message"].startswith("held <object object at")


def test_the_setting_is_text_by_default_and_refuses_anything_else():
    assert log_format({}) == "text"
    assert log_format({FORMAT_VARIABLE: " JSON "}) == "json"
    with pytest.raises(ConfigError) as refused:
        log_format({FORMAT_VARIABLE: "xml"})
    assert str(refused.value) == "environment: TANDEM_LOG_FORMAT: must be one of text, json, got 'xml'"
    with pytest.raises(ConfigError, match="TANDEM_LOG_FORMAT"):
        configure_logging("yaml")


def test_the_launcher_passes_the_setting_to_the_driver():
    assert FORMAT_VARIABLE in DRIVER_ENVIRONMENT


SCRIPT = """
import logging
from tandem.logs import batch_context, configure_logging, log_context, set_epoch
configure_logging()
log = logging.getLogger("tandem.run_plan")
log.info("starting")
log_context(plan="trades", instance="shard-1", node="node-a")
set_epoch(3)
with batch_context(9, "by_symbol"):
    log.info("batch %d", 9)
logging.getLogger("py4j").info("chatter a log stack does not want")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed")
"""


def run_script(log_format_value: str | None) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != FORMAT_VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT / "include"), env.get("PYTHONPATH")]))
    env["TANDEM_DATABASE_URL"] = "postgresql://tandem:s3cret-marker@db/tandem"
    if log_format_value is not None:
        env[FORMAT_VARIABLE] = log_format_value
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_a_process_with_json_set_writes_only_json_lines_to_stderr():
    done = run_script("json")
    assert done.returncode == 0, done.stderr
    parsed = [json.loads(line) for line in done.stderr.splitlines()]  # every line, the traceback's too
    assert [line["message"] for line in parsed] == ["starting", "batch 9", "failed"]
    assert parsed[0]["plan"] is None
    batch = parsed[1]
    assert (batch["plan"], batch["epoch"], batch["batch"], batch["query"]) == ("trades", 3, 9, "by_symbol")
    assert "ZeroDivisionError" in parsed[2]["exception"]
    assert "s3cret-marker" not in done.stderr


def test_a_process_without_the_setting_logs_text_as_before():
    done = run_script(None)
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO tandem.run_plan: starting$", first), first
    assert not done.stderr.lstrip().startswith("{")
