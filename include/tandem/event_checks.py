"""An event checked against its stream's declaration in plain Python: what the receiver refuses (pure).

The runtime checks every line on Spark (:func:`tandem.runtime.records.parse_and_validate`) and
quarantines bad ones; a receiver answers a client at once instead, with the same reasons in the same
words: a missing field, a value of the wrong JSON type, a failed check (``field 'price' must be > 0
(got -1)``), a line over ``max_line_bytes``, text that UTF-8 cannot carry, a key given twice in one
object (``duplicate key 'price'``: :func:`load_json` keeps the mark that JSON parsers drop). An event it
accepts is still checked on Spark (nothing relies on this module for correctness). The receiver also refuses
ids (``id_field`` values) that cannot be a message id: :func:`id_problem`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tandem.declarations import FieldConfig, StreamConfig

SHOWN_CHARS = 200
"""How much of a bad value a reason quotes (as the runtime's reasons do)."""
MAX_ID_CHARS = 256
"""Characters an event's id (its message id) may take at most."""
_EXPECTED = {"string": "a string", "double": "a number", "long": "an integer", "epoch_millis": "an integer"}
_WRONG = object()
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Repeated(dict):
    """A JSON object that holds a key more than once: ``repeated`` names its own such keys (sorted), else those of
    the first object within it that has some."""

    __slots__ = ("repeated",)


def load_json(text: str | bytes) -> Any:
    """``json.loads`` that remembers repeated keys: an object holding a key twice (at any depth) comes out marked,
    and :func:`event_problems` refuses it: ``duplicate key 'NAME'`` for each such key of the event itself (the
    runtime's words), or of the first object within it that has one (pure; raises ``ValueError`` as json does)."""
    return json.loads(text, object_pairs_hook=_object)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    built = dict(pairs)
    repeated = _repeated_keys(pairs) if len(built) < len(pairs) else _repeated_within(built.values())
    if not repeated:
        return built
    marked = _Repeated(built)
    marked.repeated = repeated
    return marked


def _repeated_keys(pairs: list[tuple[str, Any]]) -> tuple[str, ...]:
    seen: set[str] = set()
    repeated: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            repeated.add(name)
        seen.add(name)
    return tuple(sorted(repeated))


def _repeated_within(values: Any) -> tuple[str, ...]:
    for value in values:
        if isinstance(value, _Repeated):
            return value.repeated
        if isinstance(value, list) and (repeated := _repeated_within(value)):
            return repeated
    return ()


def id_problem(field: str, value: Any) -> str | None:
    """Why ``value`` of the event's ``field`` cannot be its id (message id), or ``None`` (pure): missing, holding a
    control character (it would end the message's header line), or longer than :data:`MAX_ID_CHARS`."""
    if value in (None, ""):
        return f"no id: field '{field}' is missing"
    text = str(value)
    if len(text) > MAX_ID_CHARS:
        return f"id field '{field}' is {len(text)} characters long, over {MAX_ID_CHARS}"
    control = _CONTROL.search(text)
    if control is not None:
        return f"id field '{field}' holds a control character (U+{ord(control.group()):04X})"
    return None


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
    if isinstance(event, _Repeated):
        return [f"duplicate key '{_shown(key)}'" for key in event.repeated]
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
