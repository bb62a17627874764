"""Values as standard JSON, for every reader of outputs (the CLI, the REST API).

JSON has no infinities: a double sum past ±1.8e308 is ±Infinity (IEEE 754), which standard JSON cannot carry.
Tandem spells them as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"``, as Protocol Buffers' JSON mapping
does; a long sum past 64 bits is ``null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


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
