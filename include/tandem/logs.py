"""How Tandem's own processes log: today's text lines, or one JSON object a line that a log stack can join.

Purpose
    A driver's lines, its batch jobs' and the receiver's carry the plan, instance, node, fencing epoch and
    micro-batch they are about, as fields, when ``TANDEM_LOG_FORMAT=json`` (:data:`FORMAT_VARIABLE`).

How it works
    :func:`configure_logging` gives the root logger one stderr handler, with the text format or a
    :class:`JsonFormatter`. The formatter reads the context when it formats a line: ``plan``, ``instance`` and
    ``node`` are the process's (:func:`log_context`, set once at a driver's start), ``epoch`` is the process's
    too (:func:`set_epoch`, by the role controller when the lease is taken or lost), ``batch`` and ``query``
    are the current thread's (:func:`batch_context`, around each ``foreachBatch`` call, which Spark runs on
    threads of its own). A field given with ``extra=`` on one call wins over the context.

What it does not do
    It does not configure the logging of a process it does not own (Airflow's task processes), and it never
    adds a field of its own beyond those above: no environment, no URL, no setting, so nothing secret gets in
    that the message itself did not hold.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from tandem.errors import ConfigError

FORMAT_VARIABLE = "TANDEM_LOG_FORMAT"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("plan", "instance", "node", "epoch", "batch", "query")
"""The context keys of every JSON line, always present (``null`` when unknown) so a log stack's schema is stable."""

_process: Mapping[str, str | None] = {"plan": None, "instance": None, "node": None}
_epoch: int | None = None
_batch: ContextVar[tuple[int | None, str | None]] = ContextVar("tandem_log_batch", default=(None, None))


def log_format(environ: Mapping[str, str] = os.environ) -> str:
    """The format ``TANDEM_LOG_FORMAT`` names: ``text`` (the default) or ``json``; anything else is a
    :class:`ConfigError`."""
    return _checked(environ.get(FORMAT_VARIABLE, "").strip().lower() or "text")


def _checked(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ConfigError("environment", FORMAT_VARIABLE, f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def configure_logging(fmt: str | None = None, level: int = logging.INFO) -> None:
    """Log to stderr at ``level`` in ``fmt`` (default: :func:`log_format`), py4j's chatter at WARNING and above.

    Like :func:`logging.basicConfig`, it leaves a root logger that already has handlers as it is.
    """
    formatter = JsonFormatter() if _checked(fmt or log_format()) == "json" else logging.Formatter(TEXT_FORMAT)
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("py4j").setLevel(logging.WARNING)


def log_context(*, plan: str | None = None, instance: str | None = None, node: str | None = None) -> None:
    """Set the plan, instance and node of every line this process logs from now on (``None``: unknown)."""
    global _process
    _process = {"plan": plan, "instance": instance, "node": node}


def set_epoch(epoch: int | None) -> None:
    """Set the fencing epoch this process publishes at (``None``: it holds no lease, a standby)."""
    global _epoch
    _epoch = epoch


@contextmanager
def batch_context(batch: int, query: str | None = None) -> Iterator[None]:
    """Within the block, this thread's lines carry micro-batch ``batch`` of ``query``."""
    token = _batch.set((batch, query))
    try:
        yield
    finally:
        _batch.reset(token)


def current_context() -> dict[str, Any]:
    """The context fields a line logged now, on this thread, carries (:data:`CONTEXT_FIELDS`)."""
    batch, query = _batch.get()
    return {**_process, "epoch": _epoch, "batch": batch, "query": query}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``,
    the :data:`CONTEXT_FIELDS`, and ``exception`` (the traceback) when the call passed one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in current_context().items():
            line[name] = getattr(record, name, value)
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)
