"""Values as standard JSON, for every reader of outputs (the CLI, the REST API).

JSON has no infinities: a double sum past ±1.8e308 is ±Infinity (IEEE 754), which standard JSON cannot carry.
Tandem spells them as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"``, as Protocol Buffers' JSON mapping
does; a long sum past 64 bits is ``null``.

Times are ISO 8601 text in UTC, whether a query's column holds a timestamp or epoch milliseconds (an ``epoch_millis``
or ``timestamp`` field, an output's ``time``): :func:`times_as_iso` spells the integers as :func:`iso_time` does, the
same text a timestamp column reads as (``datetime.isoformat`` of the UTC time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta, timezone
from numbers import Integral
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def spelled(value: Any) -> Any:
    """``value`` (nested dicts and lists too) with every non-finite float replaced by its JSON string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {key: spelled(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [spelled(item) for item in value]
    return value


def json_text(value: Any, default: Callable[[Any], Any] = str, **options: Any) -> str:
    """``value`` as standard JSON text (``json.dumps``'s ``options``): what JSON cannot hold as ``default`` says
    (datetimes as ISO text), non-finite floats :func:`spelled`. Every JSON document Tandem writes goes through here,
    PostgreSQL's ``jsonb`` (which holds finite numbers only) included, so none is a text a reader refuses."""
    try:
        return json.dumps(value, default=default, allow_nan=False, **options)
    except ValueError:  # the only ValueError of json.dumps: NaN or ±Infinity with allow_nan=False
        return json.dumps(spelled(value), default=default, allow_nan=False, **options)


def iso_time(millis: int) -> str:
    """Epoch milliseconds as ISO 8601 text in UTC, as a timestamp column of the same instant reads
    (``2026-11-26T10:00:00+00:00``; ``2026-11-26T10:00:00.250000+00:00`` with milliseconds) (pure).

    Raises:
        OverflowError: an instant outside the years 1-9999.
    """
    return (EPOCH + timedelta(milliseconds=int(millis))).isoformat()


def times_as_iso(row: Mapping[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """``row`` with each of ``fields`` that holds epoch milliseconds (an integer) as :func:`iso_time`'s text (pure).

    Other values stay as they are: text (already ISO), ``null``, a boolean, and an integer outside the years 1-9999
    (shown as the number it is rather than dropped)."""
    out = dict(row)
    for name in fields:
        value = out.get(name)
        if isinstance(value, Integral) and not isinstance(value, bool):
            try:
                out[name] = iso_time(int(value))
            except OverflowError:
                pass
    return out
