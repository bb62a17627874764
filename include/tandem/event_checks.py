"""An event checked against its stream's declaration in plain Python: what the receiver refuses (pure).

The runtime checks every line on Spark (:func:`tandem.runtime.records.parse_and_validate`) and
quarantines bad ones; a receiver answers a client at once instead, with the same reasons in the same
words: a missing field, a value of the wrong JSON type, a failed check (``field 'price' must be > 0
(got -1)``), a line over ``max_line_bytes``, text that UTF-8 cannot carry, a key given twice in one
object (``duplicate key 'price'``: :func:`load_json` keeps the mark that JSON parsers drop), a line that is not
JSON or not an object (:func:`unreadable_line`). A value a reason quotes is written by :func:`shown` (the runtime's
``_shown_value`` writes the same text): a string in double quotes, a number as Python writes it. Each field is read
at its key (its ``from``) and named as the event spells it; a ``timestamp``'s ISO-8601 text is read by
:func:`iso_millis`, which ``tandem.runtime.records.iso_time`` does in Spark's columns (the tests hold both to the
same cases). An event it accepts is still checked on Spark (nothing relies on this module for correctness). The
receiver also refuses ids (``id_field`` values) that cannot be a message id (:func:`id_problem`) and events that are
not standard JSON (NaN or an infinity anywhere, which Python reads: :func:`non_finite_problems`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from tandem.declarations import EXPECTED, ISO_TIME, FieldConfig, StreamConfig

SHOWN_CHARS = 200
"""How much of a bad value a reason quotes (as the runtime's reasons do)."""
LISTED_NON_FINITE = 5
"""Non-finite numbers of one event named at most (:func:`non_finite_problems`; one more reason counts the rest)."""
MAX_ID_CHARS = 256
"""Characters an event's id (its message id) may take at most."""
MAX_DEPTH = 512
"""Levels of nesting Python reads a JSON text to at most (an event's object is the first): the receiver refuses a
deeper event alone, and a reason does not ask the decoder where a deeper line is wrong. Python's JSON parser and
writer recurse, up to its recursion limit (about 1,000 levels, less the caller's)."""
JSON_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
"""A JSON string in a JSON text (a pattern)."""
_STRINGS = re.compile(JSON_STRING, re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
WITHOUT_ZONE = "is an ISO-8601 time without a zone (write Z or an offset such as +01:00)"
"""What a reason says of a ``timestamp`` given as ISO text without ``Z`` or an offset (refused: whose local time it
is cannot be known)."""
_WRONG = object()
_NO_ZONE = object()
_ISO_TIME = re.compile(ISO_TIME)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Repeated(dict):
    """A JSON object that holds a key more than once: ``own`` names its own such keys (sorted); ``repeated`` those,
    else those of the first object within it that has some."""

    __slots__ = ("repeated", "own")


def load_json(text: str | bytes) -> Any:
    """``json.loads`` that remembers repeated keys: an object holding a key twice (at any depth) comes out marked,
    and :func:`event_problems` refuses it: ``duplicate key 'NAME'`` for each such key of the event itself (the
    runtime's words), or of the first object within it that has one (pure; raises ``ValueError`` as json does)."""
    return json.loads(text, object_pairs_hook=_object)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    built = dict(pairs)
    own = _repeated_keys(pairs) if len(built) < len(pairs) else ()
    repeated = own or _repeated_within(built.values())
    if not repeated:
        return built
    marked = _Repeated(built)
    marked.repeated, marked.own = repeated, own
    return marked


_DECODER = json.JSONDecoder(object_pairs_hook=_object)


def load_json_at(text: str, start: int) -> tuple[Any, int]:
    """The JSON value that begins at ``start`` of ``text``, read as :func:`load_json` reads, and where it ends (pure;
    raises as ``json.JSONDecoder.raw_decode`` does)."""
    return _DECODER.raw_decode(text, start)


def depth_of(value: str) -> int:
    """How deep the JSON text ``value`` nests (an array or object: 1, a value in it: 2), from its brackets outside
    strings: a running sum in C loops, linear however it nests (pure)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", value))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


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
    """Why ``event`` (parsed JSON) is not a good event of ``stream``; ``[]`` when it is.

    Each field is read at its key (its ``from``; :meth:`~tandem.declarations.StreamConfig.value_at`) and named as
    the event spells it. A key given twice is refused: one a field reads (``duplicate key 'auth.idp'``, each such
    key, sorted), as the runtime refuses it; else any other, at any depth (the runtime lets those through: the
    receiver would publish the event with one of the values).
    """
    if not isinstance(event, dict):
        return [not_an_object(event)]
    line = json.dumps(event, ensure_ascii=False)
    try:
        size = len(line.encode("utf-8"))
    except UnicodeEncodeError:
        return ["line holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)"]
    if size > stream.max_line_bytes:
        return [f"line of {size} bytes is over the stream's max_line_bytes ({stream.max_line_bytes})"]
    if isinstance(event, _Repeated):
        keys = _declared_keys_repeated(stream, event) or event.repeated
        return [f"duplicate key '{_named(key)}'" for key in keys]
    problems: list[str] = []
    for name, config in stream.fields.items():
        label = config.label(name)
        value = stream.value_at(event, name)
        if value is None:
            if config.default is None or _required(stream, config, event):
                problems.append(config.missing(label))
            continue
        typed = typed_value(config, value)
        if typed is _WRONG:
            problems.append(f"field '{label}' is outside the 64-bit integer range: {shown(value)}"
                            if _past_64_bits(config, value) else
                            f"field '{label}' is not {EXPECTED[config.type]}: {shown(value)}")
            continue
        if typed is _NO_ZONE:
            problems.append(f"field '{label}' {WITHOUT_ZONE}: {shown(value)}")
            continue
        problems += [f"field '{label}' {message} (got {shown(value)})" for operator, bound, message in config.checks()
                     if not _holds(operator, bound, typed)]
    return problems


def _required(stream: StreamConfig, config: FieldConfig, event: dict) -> bool:
    """Whether a field with a default must be given all the same: its ``required_since`` is at or before the
    event's time (not when the event's time is not a valid one: that is its own problem)."""
    if config.required_since_ms is None:
        return False
    at = stream.value_at(event, stream.event_time)
    moment = None if at is None else typed_value(stream.fields[stream.event_time], at)
    return isinstance(moment, int) and moment >= config.required_since_ms  # not _WRONG, not _NO_ZONE


def _declared_keys_repeated(stream: StreamConfig, event: _Repeated) -> list[str]:
    """The keys the stream's fields read that an object on their path holds twice, as ``auth.idp`` (sorted)."""
    found = set()
    for path in (path for name, config in stream.fields.items() for path in config.paths(name)):
        holder = event
        for depth, key in enumerate(path):
            if not isinstance(holder, dict):
                break
            if isinstance(holder, _Repeated) and key in holder.own:
                found.add(".".join(path[:depth + 1]))
            holder = holder.get(key)
    return sorted(found)


def typed_value(config: FieldConfig, value: Any) -> Any:
    """``value`` (not null) as the field's column holds it; ``_WRONG`` when its JSON type is not the field's, or
    ``_NO_ZONE`` for ISO text without a zone in a ``timestamp`` (pure)."""
    if config.type == "string":
        return value if isinstance(value, str) else _WRONG
    if config.type == "boolean":
        return value if isinstance(value, bool) else _WRONG
    if config.type == "timestamp" and isinstance(value, str):
        return iso_millis(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _WRONG
    if config.type == "double":
        return _double(value)
    return value if isinstance(value, int) and -2**63 <= value < 2**63 else _WRONG


def _double(value: int | float) -> float:
    """``value`` as a double: an integer past the largest double is an infinity, as Spark reads it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def non_finite_problems(event: Any) -> list[str]:
    """Why ``event`` cannot be written as standard JSON: a reason for each NaN or infinity in it (Python reads ``NaN``,
    ``Infinity`` and a number past ±1.8e308 as one; JSON has none), named by its path (``extra.ratio``,
    ``extra[1]``); the first :data:`LISTED_NON_FINITE` of them, then how many more (pure)."""
    found = [(path, value) for path, value in leaves(event) if isinstance(value, float) and not math.isfinite(value)]
    problems = [f"field '{path}' must be a finite number (got {shown(value)}): JSON has no such number"
                for path, value in found[:LISTED_NON_FINITE]]
    if len(found) > LISTED_NON_FINITE:
        problems.append(f"and {len(found) - LISTED_NON_FINITE} more numbers that are not finite")
    return problems


def leaves(value: Any) -> Iterator[tuple[str, Any]]:
    """Every value within ``value`` (parsed JSON) that is neither an object nor an array, with its path
    (``auth.idp``, ``extra[1]``), in the order of the text; iterative, however deep it nests (pure)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{path}.{key}" if path else str(key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", child) for index, child in reversed(list(enumerate(item))))
        else:
            yield path, item


def iso_millis(text: str) -> Any:
    """ISO-8601 ``text`` (:data:`~tandem.declarations.ISO_TIME`) as epoch milliseconds (a fraction past the
    millisecond dropped; the years 0000-9999 of the proleptic Gregorian calendar, which Spark's dates use too);
    ``_NO_ZONE`` for a time without ``Z`` or an offset; ``_WRONG`` for other text or a day its month does not have
    (pure)."""
    match = _ISO_TIME.fullmatch(text)
    if match is None:
        return _WRONG
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    fraction, zone, sign, offset_hours, offset_minutes = match.groups()[6:]
    if day > days_in_month(year, month):
        return _WRONG
    if zone is None:
        return _NO_ZONE
    offset = 0 if sign is None else (1 if sign == "+" else -1) * (int(offset_hours) * 3600 + int(offset_minutes) * 60)
    seconds = epoch_day(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset
    return seconds * 1000 + int((fraction or "")[:3].ljust(3, "0"))


def days_in_month(year: int, month: int) -> int:
    """The days of ``month`` in ``year`` (proleptic Gregorian) (pure)."""
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def epoch_day(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a date of the years 0-9999 (the Julian day number less 2,440,588) (pure)."""
    shift = (14 - month) // 12
    y, m = year + 4800 - shift, month + 12 * shift - 3
    return day + (153 * m + 2) // 5 + 365 * y + y // 4 - y // 100 + y // 400 - 32045 - 2440588


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


JSON_KINDS = {"OBJECT": "an object", "ARRAY": "an array", "STRING": "a string", "BOOLEAN": "a boolean",
              "VOID": "null"}
"""What a JSON value is, as a reason says it (``not a JSON object (got an array)``), by the first word of Spark's
``schema_of_variant`` (any other word is a number); :func:`json_kind` says the same of a Python value."""


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in a reason's words (:data:`JSON_KINDS`) (pure)."""
    if isinstance(value, dict):
        return JSON_KINDS["OBJECT"]
    if isinstance(value, list):
        return JSON_KINDS["ARRAY"]
    if isinstance(value, str):
        return JSON_KINDS["STRING"]
    if isinstance(value, bool):
        return JSON_KINDS["BOOLEAN"]
    return JSON_KINDS["VOID"] if value is None else "a number"


def not_an_object(value: Any) -> str:
    """The reason of a line that is JSON but not an object (``not a JSON object (got an array)``) (pure)."""
    return f"not a JSON object (got {json_kind(value)})"


def unreadable_line(raw: str | None) -> str | None:
    """The reason of a line that is not a JSON object, as Python's JSON decoder reads it (pure): ``invalid JSON:
    Expecting ',' delimiter at line 1 column 23`` (the decoder's message), or :func:`not_an_object`; ``None`` for no
    line. The runtime asks it of the lines Spark's reader finds no object in. A line nested deeper than
    :data:`MAX_DEPTH` is not decoded (``not a JSON object, nested 900 levels deep (…)``); where the decoder cannot
    say (an integer of more digits than Python converts, an object only Spark's reader refuses), ``invalid JSON``
    alone."""
    if raw is None:
        return None
    depth = depth_of(raw)
    if depth > MAX_DEPTH:  # the decoder would recurse past Python's limit, whose depth depends on the caller's
        return f"not a JSON object, nested {depth} levels deep (the decoder that says more reads {MAX_DEPTH} at most)"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except ValueError:  # an integer of more digits than Python converts, before the error
        return "invalid JSON"
    return "invalid JSON" if isinstance(value, dict) else not_an_object(value)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value: Any) -> str:
    """A value as a reason quotes it (``must not be empty (got "")``, ``is not a boolean: "yes"``, ``must be < 10
    (got 1796680000.5)``), at most :data:`SHOWN_CHARS` characters (then ``…``) (pure): its JSON text, a string in
    double quotes escaped as Spark's JSON writer escapes it (other control characters as ``\\u001F``, so ``"true"``
    is told from ``true``), a number as Python writes it (``repr``), ``NaN`` and the infinities in quotes (as Spark
    writes them back). The runtime writes the same text (``tandem.runtime.records._shown_value``)."""
    if isinstance(value, float) and not math.isfinite(value):
        text = json.dumps(str(value).replace("inf", "Infinity").replace("nan", "NaN"))
    elif isinstance(value, str):
        text = '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if c < " " else c) for c in value) + '"'
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text[:SHOWN_CHARS] + ("…" if len(text) > SHOWN_CHARS else "")


_JAVA_DOUBLE = re.compile(r"-?[0-9]+\.[0-9]+(?:E-?[0-9]+)?")
"""A double as Java's ``Double.toString`` writes it: what Spark's JSON reader gives of a number with a fraction or an
exponent read as text (``1796680000.5`` as ``1.7966800005E9``, ``1e-7`` as ``1.0E-7``)."""


def shown_text(text: str | None, is_string: bool | None) -> str | None:
    """A value Spark's JSON reader gave as ``text`` (``is_string``: the line holds a JSON string there), as
    :func:`shown` writes the value (pure): a string quoted, a double as Python writes it (Java's text reads back as
    the same double), anything else (an integer's digits, ``true``, an object, ``"NaN"``) as its JSON text. The
    runtime's reasons quote their values through it."""
    if text is None:
        return None
    if is_string:
        return shown(text)
    if _JAVA_DOUBLE.fullmatch(text):
        return shown(float(text))
    return text[:SHOWN_CHARS] + ("…" if len(text) > SHOWN_CHARS else "")


def _named(key: str) -> str:
    """A key as a reason names it (``duplicate key 'price'``): as it is, NUL as ``\\u0000``, at most
    :data:`SHOWN_CHARS` characters (then ``…``)."""
    text = key.replace("\u0000", "\\u0000")
    return text[:SHOWN_CHARS] + ("…" if len(text) > SHOWN_CHARS else "")
