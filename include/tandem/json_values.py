"""Values as standard JSON, for every reader of outputs (the CLI, the REST API).

JSON has no infinities: a double sum past ±1.8e308 is ±Infinity (IEEE 754), which standard JSON cannot carry.
Tandem spells them as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"``, as Protocol Buffers' JSON mapping
does; a long sum past 64 bits is ``null``.
"""

from __future__ import annotations

import json
import math
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


def json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as standard JSON text: datetimes as ISO text, non-finite floats :func:`spelled`."""
    return json.dumps(spelled(value), default=str, allow_nan=False, indent=indent)
