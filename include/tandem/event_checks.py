"""An event checked against its stream's declaration in plain Python: what the receiver refuses (pure).

The runtime checks every line on Spark (:func:`tandem.runtime.records.parse_and_validate`) and
quarantines bad ones; a receiver answers a client at once instead, with the same reasons in the same
words: a missing field, a value of the wrong JSON type, a failed check (``field 'price' must be > 0
(got -1)``), a line over ``max_line_bytes``, text that UTF-8 cannot carry. An event it accepts is
still checked on Spark (nothing relies on this module for correctness).
"""

from __future__ import annotations

import json
import math
from typing import Any

from tandem.declarations import FieldConfig, StreamConfig

SHOWN_CHARS = 200
"""How much of a bad value a reason quotes (as the runtime's reasons do)."""
_EXPECTED = {"string": "a string", "double": "a number", "long": "an integer", "epoch_millis": "an integer"}
_WRONG = object()


def event_problems(stream: StreamConfig, event: Any) -> list[str]:
    """Why ``event`` (parsed JSON) is not a good event of ``stream``; ``[]`` when it is."""
    if not isinstance(event, dict):
        return ["malformed JSON: not a JSON object"]
    line = json.dumps(event, ensure_ascii=False)
    try:
        size = len(line.encode("utf-8"))
    except UnicodeEncodeError:
        return ["line holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)"]
    if size > stream.max_line_bytes:
        return [f"line of {size} bytes is over the stream's max_line_bytes ({stream.max_line_bytes})"]
    problems: list[str] = []
    for name, config in stream.fields.items():
        value = event.get(name)
        if value is None:
            problems.append(f"missing field '{name}'")
            continue
        typed = _typed(config, value)
        shown = _shown(value)
        if typed is _WRONG:
            what = "is outside the 64-bit integer range" if _past_64_bits(config, value) else \
                f"is not {_EXPECTED[config.type]}"
            problems.append(f"field '{name}' {what}: {shown}")
            continue
        problems += [f"field '{name}' {message} (got {shown})" for operator, bound, message in config.checks()
                     if not _holds(operator, bound, typed)]
    return problems


def _typed(config: FieldConfig, value: Any) -> Any:
    """``value`` as the field's type, or ``_WRONG`` when its JSON type is not the field's."""
    if config.type == "string":
        return value if isinstance(value, str) else _WRONG
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _WRONG
    if config.type == "double":
        return float(value)
    return value if isinstance(value, int) and -2**63 <= value < 2**63 else _WRONG


def _past_64_bits(config: FieldConfig, value: Any) -> bool:
    return config.type in ("long", "epoch_millis") and isinstance(value, int) and not isinstance(value, bool)


def _holds(operator: str, bound: Any, value: Any) -> bool:
    if operator == "not_empty":
        return bool(value.strip(" "))  # Spark's trim: spaces only
    if operator == "no_nul":
        return "\u0000" not in value
    if operator == "max_length":
        return len(value) <= bound
    if operator == "finite":
        return math.isfinite(value)
    if operator == "between":
        return bound[0] <= value <= bound[1]
    return {">": value > bound, ">=": value >= bound, "<": value < bound, "<=": value <= bound}[operator]


def _shown(value: Any) -> str:
    """A bad value as a reason quotes it: its JSON text (a string as is), at most :data:`SHOWN_CHARS` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\u0000", "\\u0000")
    return text[:SHOWN_CHARS] + ("…" if len(text) > SHOWN_CHARS else "")
