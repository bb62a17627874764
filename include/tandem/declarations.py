"""What a plan declares: its streams, its execution groups and its outputs (pure; no Spark).

Streams
    A stream is JSON-lines events with typed, checked fields, an event-time field and a
    partition key. Producers write each event into one of the stream's fixed ``partitions``,
    chosen by :func:`partition_of` on the key (the layout every client must follow: see
    ``docs/partitions.md``), so everything about one key (a room, an order) reaches one instance.

Execution groups
    A group runs some of the plan's queries with ``parallel`` instances. Instance ``i`` (1-based)
    of group ``g`` is the HA unit ``g-i`` (its own lease, ACTIVE / PASSIVE / BACKUP nodes) and
    reads the partitions ``p`` with ``p % parallel == i - 1`` of every stream.

Outputs
    Every output has a kind: ``aggregation`` (partial aggregates per instance, merged on read),
    ``table`` (a value per key, merged across instances on read), ``events`` (append-only
    notifications, exactly one row per deterministic event id) or ``quarantine`` (bad input with
    the reason).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, \
    StrictFloat, StrictInt, StrictStr, WithJsonSchema, model_validator

FIELD_PATTERN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
"""A field, key, measure, value or table name: also a PostgreSQL identifier (at most 63 bytes) as it is."""
RESERVED_WORDS = frozenset("""
    all analyse analyze and any array as asc asymmetric authorization binary both case cast check collate collation
    column concurrently constraint create cross current_catalog current_date current_role current_schema current_time
    current_timestamp current_user default deferrable desc distinct do else end except false fetch for foreign freeze
    from full grant group having ilike in initially inner intersect into is isnull join lateral leading left like limit
    localtime localtimestamp natural not notnull null offset on only or order outer overlaps placing primary
    references returning right select session_user similar some symmetric table tablesample then to trailing true
    union unique user using variadic verbose when where window with""".split())
"""PostgreSQL 15's reserved key words (``SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T')``: the
"reserved" and "reserved (can be function or type)" rows of the documentation's key word table): none of them can
name a table or column without quotes, so no name in a plan is one."""
AGGREGATION_COLUMNS = ("plan", "granularity", "bucket_start", "instance", "epoch", "batch_id", "updated_at")
"""The columns every aggregation table has besides its keys and measures (:mod:`tandem.store.aggregates`)."""
MAX_PARTITIONS = 1024
MAX_EPOCH_MILLIS = 253402300799999  # 9999-12-31T23:59:59.999Z
FIELD_TYPES = ("string", "double", "long", "boolean", "epoch_millis", "timestamp")
TIME_TYPES = ("epoch_millis", "timestamp")
EXPECTED = {"string": "a string", "double": "a number", "long": "an integer", "epoch_millis": "an integer",
            "boolean": "a boolean",
            "timestamp": "a timestamp (epoch milliseconds, or ISO-8601 text with Z or an offset)"}
"""What a value of each field type is, as a reason says it (``field 'success' is not a boolean: "yes"``): the
runtime's reasons use these words too (:mod:`tandem.runtime.records`)."""

"""The field types whose column holds epoch milliseconds (a ``timestamp`` is read from either spelling)."""
ISO_TIME = (r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])"
            r"(?:[.,]([0-9]{1,9}))?([Zz]|([+-])([01][0-9]|2[0-3]):?([0-5][0-9]))?")
"""An ISO-8601 time as a ``timestamp`` field takes it (RFC 3339's profile, ``+0100`` too): date, ``T`` (or a space),
time to the second, an optional fraction (1 to 9 digits: a time is kept to the millisecond, the rest dropped), and
``Z`` or an offset; the zone's group is optional so that a time without one is told apart (and refused). Groups:
year, month, day, hour, minute, second, fraction, zone, offset sign, offset hours, offset minutes. Unanchored: each
side anchors it (Python's ``fullmatch``, Java's ``^…\\z``), and ``[0-9]`` is ASCII in both."""
DEFAULT_MAX_STRING_LENGTH = 256
"""Characters a string field may hold unless it declares ``max_length``: short enough for any key of any
output kind (PostgreSQL's btree indexes take at most ~2,700 bytes a row, and a character may take 4)."""
MAX_STRING_LENGTH = 1_000_000
DEFAULT_MAX_LINE_BYTES = 1024 * 1024
"""Bytes an input line may take unless its stream declares ``max_line_bytes``; longer lines are quarantined unparsed."""
MAX_LINE_BYTES = 64 * 1024 * 1024
DEFAULT_RETENTION_S = 7 * 86400.0
"""How long a ``nats`` stream's messages are kept unless it declares ``retention``."""


_UNITS = {
    0.001: ("ms", "millis", "millisecond", "milliseconds"),
    1.0: ("s", "sec", "secs", "second", "seconds"),
    60.0: ("m", "min", "mins", "minute", "minutes"),
    3600.0: ("h", "hour", "hours"),
    86400.0: ("d", "day", "days"),
}
_UNIT_SECONDS = {name: factor for factor, names in _UNITS.items() for name in names}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_duration(text: Any) -> float:
    """Parse ``"500 ms"``, ``"2 seconds"``, ``"1m"``, ``"1 day"`` or a bare number of seconds into seconds."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration such as '2 seconds', got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text).lower())
        if not match or (match.group(2) and match.group(2) not in _UNIT_SECONDS):
            raise ValueError(f"expected a duration such as '2 seconds', '500 ms' or '1 day', got {text!r}")
        number, unit = match.groups()
        seconds = float(number) * _UNIT_SECONDS.get(unit, 1.0)
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration, got {text!r}")
    if seconds <= 0:
        raise ValueError(f"must be positive, got {text!r}")
    return seconds


def parse_instant(text: Any) -> datetime:
    """Parse an ISO 8601 time (``2026-11-26T10:00:00Z``, ``2026-11-26 10:00+01:00``) into an aware datetime; one
    that names no zone is UTC."""
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(f"expected an ISO time such as 2026-11-26T10:00:00Z, got {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def instant_argument(text: str) -> datetime:
    """:func:`parse_instant` as an argparse type (a bad value is a usage error naming the option)."""
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_DURATION_SCHEMA = {"anyOf": [{"type": "string", "examples": ["500 ms", "2 seconds", "1 minute", "1 day"]},
                              {"type": "number", "exclusiveMinimum": 0}],
                    "description": "a duration: '500 ms', '2 seconds', '3 minutes', '1 hour', '1 day', or seconds"}
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(_DURATION_SCHEMA)]

def matching(pattern: re.Pattern, what: str) -> AfterValidator:
    """A pydantic check that a string matches ``pattern`` (``what`` says what it must be)."""
    def check(value: str) -> str:
        if not pattern.fullmatch(value):  # match() would let a trailing newline through ``$``
            raise ValueError(f"{value[:80]!r} must match {pattern.pattern} ({what})")
        return value

    return AfterValidator(check)


def _not_reserved(value: str) -> str:
    if value in RESERVED_WORDS:
        raise ValueError(f"{value!r} is a reserved word of SQL (PostgreSQL): choose another name")
    return value


NOT_RESERVED = AfterValidator(_not_reserved)
"""A pydantic check that a name is none of :data:`RESERVED_WORDS`."""
FieldName = Annotated[StrictStr, matching(FIELD_PATTERN, "lower-case letters, digits and _"), NOT_RESERVED]
PLAN_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
Number = StrictInt | StrictFloat


def _stream_field_name(value: str) -> str:
    if not FIELD_PATTERN.fullmatch(value):
        raise ValueError(f"field {value[:80]!r} must match {FIELD_PATTERN.pattern} (lower-case letters, digits and _, "
                         f"a column name as it is); name it so and read the event's key with from: {value[:80]}")
    if value in RESERVED_WORDS:
        raise ValueError(f"field {value!r} is a reserved word in PostgreSQL; name it otherwise and read the key "
                         f"with from: {value}")
    return value


StreamFieldName = Annotated[StrictStr, AfterValidator(_stream_field_name)]
"""A stream field's name: its column everywhere downstream (:data:`FieldName`'s rules; its refusals point to
``from:``, which reads a JSON key of any spelling into it)."""
MAX_KEY_CHARS = 256
"""Characters a JSON key in a field's ``from:`` may take."""


def key_path(value: Any) -> Any:
    """``from:`` as the keys of its path: ``"auth.idp"`` → ``("auth", "idp")``; a list is the keys as they are (so
    ``["a.b"]`` reads the key ``a.b``) (pure; ``ValueError`` for what names no key)."""
    if isinstance(value, str):
        keys = value.split(".")
        if "" in keys:
            raise ValueError(f"{value[:80]!r} has an empty key: write a key (user), a path of keys (auth.idp), "
                             "or a list of keys ([auth, idp]; [a.b] reads a key holding a dot)")
        return tuple(keys)
    if isinstance(value, list):
        if not value or not all(isinstance(key, str) for key in value):
            raise ValueError(f"expected a key, a path (auth.idp) or a list of keys, got {repr(value)[:80]}")
        if "" in value:
            raise ValueError("a key must not be empty")
        return tuple(value)
    raise ValueError(f"expected a key, a path (auth.idp) or a list of keys, got {repr(value)[:80]}")


def _key_lengths(path: tuple[str, ...]) -> tuple[str, ...]:
    long = next((key for key in path if len(key) > MAX_KEY_CHARS), None)
    if long is not None:
        raise ValueError(f"the key {long[:80]!r}… is over {MAX_KEY_CHARS} characters")
    return path


def value_at(event: Any, path: tuple[str, ...]) -> Any:
    """The value at the keys ``path`` of ``event`` (parsed JSON), ``None`` when there is none (pure)."""
    for key in path:
        if not isinstance(event, dict):
            return None
        event = event.get(key)
    return event


_KEY_PATH_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1, "examples": ["user", "user-id", "@timestamp",
                                                                               "auth.idp"]},
                              {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}],
                    "description": "the JSON key the field reads (default: its name): a key, a path of keys into "
                                   "nested objects (auth.idp), or a list of keys ([auth, idp]; [a.b] reads a key "
                                   "holding a dot)"}
KeyPath = Annotated[tuple[str, ...], BeforeValidator(key_path), AfterValidator(_key_lengths),
                    WithJsonSchema(_KEY_PATH_SCHEMA)]


class StrictModel(BaseModel):
    """Strict, immutable, unknown fields refused; YAML names are the aliases, attributes may differ."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


class FieldConfig(StrictModel):
    """One field of a stream's events: its JSON type, the JSON key it reads and the checks a good value passes.

    ``epoch_millis`` is an integer of milliseconds since 1970 (between 1970 and 9999). A ``timestamp`` is such an
    integer, or ISO-8601 text with ``Z`` or an offset (:data:`ISO_TIME`; text without a zone is refused: whose
    local time it is cannot be known); its column holds epoch milliseconds as an ``epoch_millis`` one does. A
    ``boolean`` is ``true`` or ``false`` (not ``"true"``, not ``1``). Every type refuses what no sink can store: a
    ``double`` must be finite, a ``long`` must fit 64 bits, a ``string`` must not hold NUL and holds at most
    ``max_length`` characters (default :data:`DEFAULT_MAX_STRING_LENGTH`).

    ``from``: the key the field reads when it is not the field's name (:func:`key_path`): the field's name
    stays its column everywhere downstream; a reason names the key as the event spells it (:meth:`label`).
    """

    model_config = ConfigDict(populate_by_name=False)  # ``from`` only: ``source`` names a stream's kind in YAML

    type: Literal["string", "double", "long", "boolean", "epoch_millis", "timestamp"]
    source: KeyPath | None = Field(None, alias="from")
    formerly: KeyPath | None = None
    """The key the field was read from before a producer renamed it: read where the line has no value at the field's
    own key, no key or ``null`` (events written before the rename stay good); a value of the wrong type at the own key
    is refused, never replaced by the former key's (the receiver's and the runtime's rule)."""
    not_empty: StrictBool = False
    max_length: Annotated[StrictInt, Field(gt=0, le=MAX_STRING_LENGTH)] | None = None
    greater_than: Number | None = None
    at_least: Number | None = None
    less_than: Number | None = None
    at_most: Number | None = None
    default: StrictBool | StrictInt | StrictFloat | StrictStr | None = None
    """The value of an event that does not give the field (or gives ``null``): a field a producer added, so that
    the events written before it (retained input, replays, backfills) stay good. A value given is checked as ever."""
    required_since: AwareDatetime | None = None
    """From this instant of event time on, an event must give the field: its ``default`` is for the events before
    (a field a producer added and made required; the events written before stay good, those after are refused
    without it)."""

    @model_validator(mode="after")
    def _checks_fit_the_type(self) -> FieldConfig:
        bounds = [self.greater_than, self.at_least, self.less_than, self.at_most]
        if self.type == "string" and any(b is not None for b in bounds):
            raise ValueError("a string field takes not_empty, not numeric bounds")
        if self.type == "boolean" and any(b is not None for b in bounds):
            raise ValueError("a boolean field takes no bounds")
        if self.type != "string" and (self.not_empty or self.max_length is not None):
            raise ValueError("not_empty and max_length apply to string fields only")
        if self.default is not None:
            self._check_default(self.default)
        if self.required_since is not None and self.default is None:
            raise ValueError("required_since needs a default: the value of the events before it")
        return self

    @property
    def required_since_ms(self) -> int | None:
        """:attr:`required_since` in epoch milliseconds (``None``: a field with a default is never required)."""
        return None if self.required_since is None else int(self.required_since.timestamp() * 1000)

    def missing(self, label: str) -> str:
        """The reason of an event without the field (one that must give it)."""
        if self.required_since is None:
            return f"missing field '{label}'"
        since = self.required_since.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        return f"missing field '{label}' (required of events since {since})"

    def _check_default(self, value: Any) -> None:
        fits = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
                "double": isinstance(value, (int, float)) and not isinstance(value, bool),
                }.get(self.type, isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63)
        if not fits:
            raise ValueError(f"default {value!r} is not {EXPECTED[self.type]}")
        bounds = {"greater_than": (lambda v, b: v > b, ">"), "at_least": (lambda v, b: v >= b, ">="),
                  "less_than": (lambda v, b: v < b, "<"), "at_most": (lambda v, b: v <= b, "<=")}
        for name, (holds, operator) in bounds.items():
            bound = getattr(self, name)
            if bound is not None and not holds(value, bound):
                raise ValueError(f"default {value!r} must be {operator} {bound:g} ({name})")
        if self.type == "string" and ((self.not_empty and not value.strip()) or "\x00" in value
                                      or len(value) > (self.length_limit or 0)):
            raise ValueError(f"default {value[:40]!r} fails the field's own checks (not empty, no NUL, max_length)")
        if self.type in TIME_TYPES and not 0 <= value <= MAX_EPOCH_MILLIS:
            raise ValueError(f"default {value!r} must be epoch milliseconds between 1970 and 9999")

    def path(self, name: str) -> tuple[str, ...]:
        """The keys the field named ``name`` reads, outermost first: its ``from``, else its name."""
        return self.source or (name,)

    def paths(self, name: str) -> tuple[tuple[str, ...], ...]:
        """Every path the field reads, the one it names first (then its ``formerly``)."""
        return (self.path(name),) if self.formerly is None else (self.path(name), self.formerly)

    def label(self, name: str) -> str:
        """The field as a reason names it: its key as the event spells it (``auth.idp``; its name without ``from``)."""
        return ".".join(self.path(name))

    @property
    def column_type(self) -> str:
        """The type of the field's column: its type, but ``epoch_millis`` for a ``timestamp`` (epoch milliseconds)."""
        return "epoch_millis" if self.type == "timestamp" else self.type

    @property
    def length_limit(self) -> int | None:
        """The most characters a string field holds (``None`` for other types)."""
        return (self.max_length or DEFAULT_MAX_STRING_LENGTH) if self.type == "string" else None

    def checks(self) -> list[tuple[str, Any, str]]:
        """``(operator, bound, message)`` for every check, in a fixed order."""
        out: list[tuple[str, Any, str]] = []
        if self.not_empty:
            out.append(("not_empty", None, "must not be empty"))
        if self.type == "string":
            out.append(("no_nul", None, "must not contain NUL (U+0000)"))
            out.append(("max_length", self.length_limit, f"must be at most {self.length_limit} characters long"))
        if self.type == "double":
            out.append(("finite", None, "must be a finite number"))
        for operator, bound in ((">", self.greater_than), (">=", self.at_least), ("<", self.less_than),
                                ("<=", self.at_most)):
            if bound is not None:
                out.append((operator, bound, f"must be {operator} {bound:g}"))
        if self.type == "epoch_millis":
            out.append(("between", (0, MAX_EPOCH_MILLIS), "must be epoch milliseconds between 1970 and 9999"))
        if self.type == "timestamp":
            out.append(("between", (0, MAX_EPOCH_MILLIS), "must be a time between 1970 and 9999"))
        return out


class StreamRetention(StrictModel):
    """How long the JetStream stream of a ``nats`` stream keeps messages: the oldest go first once any limit is
    reached. A reader (an instance, a snapshot to restore) that still needs a message retention dropped stops
    with an error that names the stream and the missing sequences."""

    max_age_s: Duration | None = Field(DEFAULT_RETENTION_S, alias="max_age")
    max_bytes: Annotated[StrictInt, Field(gt=0)] | None = None
    max_messages: Annotated[StrictInt, Field(gt=0)] | None = None


@dataclass(frozen=True)
class SourceRules:
    """What a stream's declaration may say, by its source kind (:data:`SOURCE_RULES`): the configuration checks these
    (it sits below the source kinds, :mod:`tandem.sources`, whose kinds each keep their rules as ``rules``)."""

    settings: tuple[str, ...]
    """The settings of this kind alone: another kind's stream declaring one is refused."""
    on_messaging_layer: bool
    """Its lines are messages of the messaging layer (``nats:`` in cluster.yaml): it cannot be used without one."""
    published_to: bool
    """An output may publish to it (``outputs.<name>.stream``)."""
    shared: bool
    """Cluster-wide: one plan declares it, others may read it (``from_plan``), two plans may not write to it."""


SOURCE_RULES: dict[str, SourceRules] = {
    "files": SourceRules(settings=("max_files_per_trigger",), on_messaging_layer=False, published_to=False,
                         shared=False),
    "nats": SourceRules(settings=("max_events_per_trigger", "retention", "from_plan"), on_messaging_layer=True,
                        published_to=True, shared=True),
}


def sources_where(rule: str) -> str:
    """The source kinds whose rule ``rule`` holds, as an error message names them (``nats``; ``a or b``)."""
    return " or ".join(name for name, rules in SOURCE_RULES.items() if getattr(rules, rule))


class StreamConfig(StrictModel):
    """An input stream: JSON lines, ``partitions`` of them: files in ``landing/<stream>/<partition>/``, or
    messages on the NATS subjects ``<prefix>.<stream>.<partition>``.

    A line over ``max_line_bytes`` is quarantined without being parsed; fields that are not declared
    are skipped however deeply they nest. Each field reads the JSON key of its name, or of its ``from`` (a key of
    any spelling, or a path into nested objects): its name is its column.
    """

    source: Literal["files", "nats"] = "files"
    """Where the stream's lines come from (its source kind, :data:`tandem.sources.SOURCE_KINDS`): ``files``, the
    landing folders of its partitions; ``nats``, a JetStream stream (``retention``)."""
    format: Literal["jsonl"] = "jsonl"
    partitions: Annotated[StrictInt, Field(gt=0, le=MAX_PARTITIONS)]
    key: FieldName
    event_time: FieldName
    max_files_per_trigger: Annotated[StrictInt, Field(gt=0)] = 1000
    """``files``: at most this many new files in one micro-batch."""
    max_events_per_trigger: Annotated[StrictInt, Field(gt=0)] = 100_000
    """``nats``: at most this many stream sequences (so at most this many messages) in one micro-batch."""
    retention: StreamRetention = StreamRetention()
    """``nats``: the JetStream stream's limits (default: seven days)."""
    max_line_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_LINE_BYTES)] = DEFAULT_MAX_LINE_BYTES
    fields: Annotated[dict[StreamFieldName, FieldConfig], Field(min_length=1)]
    """The fields queries see, by name (their columns); each reads the JSON key of its name or its ``from``."""
    from_plan: Annotated[StrictStr, matching(PLAN_NAME_PATTERN, "a plan's name")] | None = None
    """``nats``: the plan that declares this NATS stream (its input, or a stream an output of it publishes to):
    this plan reads it on purpose and never writes to it (producers and the receiver refuse it here). A NATS
    stream is declared by one plan; any other declaring the same name must say ``from_plan``, with the same
    partitions, key and retention (checked when every plan is loaded)."""

    @property
    def rules(self) -> SourceRules:
        """What its source kind allows it (:data:`SOURCE_RULES`)."""
        return SOURCE_RULES[self.source]

    @model_validator(mode="after")
    def _settings_of_its_source(self) -> StreamConfig:
        others = [name for kind, rules in SOURCE_RULES.items() if kind != self.source for name in rules.settings
                  if name not in self.rules.settings]
        misplaced = [name for name in others if name in self.model_fields_set]
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)}: not a setting of a {self.source} stream")
        return self

    @model_validator(mode="after")
    def _named_fields_exist(self) -> StreamConfig:
        if self.key not in self.fields:
            raise ValueError(f"key {self.key!r} is not one of the fields ({', '.join(self.fields)})")
        if self.event_time not in self.fields:
            raise ValueError(f"event_time {self.event_time!r} is not one of the fields ({', '.join(self.fields)})")
        if self.fields[self.event_time].type not in TIME_TYPES:
            raise ValueError(f"event_time {self.event_time!r} must be a field of type epoch_millis or timestamp")
        if self.fields[self.key].type == "timestamp":
            raise ValueError(f"key {self.key!r}: a timestamp cannot be a partition key (an event's partition is "
                             "computed from the key's JSON text, and one time has many spellings): declare it "
                             "epoch_millis")
        for role, name in (("key", self.key), ("event_time", self.event_time)):
            if self.fields[name].default is not None:
                raise ValueError(f"{role} {name!r} takes no default: every event must give its own")
        if self.fields[self.key].type == "boolean":
            raise ValueError(f"key {self.key!r}: a boolean cannot be a partition key (its two values would leave "
                             "the other partitions empty)")
        return self

    @model_validator(mode="after")
    def _one_field_a_key(self) -> StreamConfig:
        paths = sorted((path, name) for name, config in self.fields.items() for path in config.paths(name))
        for (path, name), (other_path, other) in zip(paths, paths[1:]):
            if other_path == path:
                raise ValueError(f"fields {name!r} and {other!r} both read the key {'.'.join(path)!r}: "
                                 "a key is read by one field")
            if other_path[:len(path)] == path:
                raise ValueError(f"field {name!r} reads the key {'.'.join(path)!r} and field {other!r} a key inside "
                                 f"it ({'.'.join(other_path)!r}): a key holds a value or an object, not both")
        spelled: dict[tuple[tuple[str, ...], str], str] = {}
        for path, _ in paths:
            for depth, key in enumerate(path):
                first = spelled.setdefault((path[:depth], key.casefold()), key)
                if first != key:
                    raise ValueError(f"the keys {'.'.join((*path[:depth], first))!r} and "
                                     f"{'.'.join(path[:depth + 1])!r} differ only in case: Spark cannot address "
                                     "both (its field names ignore case)")
        return self

    def value_at(self, event: Any, name: str) -> Any:
        """The value of field ``name`` in ``event`` (parsed JSON, as the event spells it), ``None`` when the event has
        none there: at its key, at its ``formerly`` key only where the event has none at its key (a value of the wrong
        type there is the field's; :func:`tandem.runtime.records.value_of` is the same rule on Spark) (pure)."""
        paths = self.fields[name].paths(name)
        found = value_at(event, paths[0])
        return value_at(event, paths[1]) if found is None and len(paths) > 1 else found

    def event_of(self, values: dict[str, Any]) -> dict[str, Any]:
        """An event holding ``values`` (by field name) as the stream's events spell it: each declared field's value
        at its key (nested objects made for paths), any other entry as it is (pure)."""
        event = {name: value for name, value in values.items() if name not in self.fields}
        for name, value in values.items():
            if name not in self.fields:
                continue
            *outer, last = self.fields[name].path(name)
            holder = event
            for key in outer:
                if not isinstance(holder.get(key), dict):
                    holder[key] = {}
                holder = holder[key]
            holder[last] = value
        return event


class GroupConfig(StrictModel):
    """An execution group: the queries it runs and how many instances (``parallel``) share the partitions."""

    parallel: Annotated[StrictInt, Field(gt=0, le=MAX_PARTITIONS)] = 1
    queries: Annotated[list[FieldName], Field(min_length=1)]


MEASURE_FUNCTIONS = ("sum", "count", "min", "max", "distinct", "distinct_exact")
DEFAULT_MAX_VALUES = 100_000
"""How many distinct values a ``distinct_exact`` measure's stored partial holds at most, unless it declares
``max_values``."""
MAX_MAX_VALUES = 1_000_000
"""The largest ``max_values`` a ``distinct_exact`` measure may declare: a partial is read whole, by every roll-up of
its parent (which reads all its children) and every merge on read."""
EXACT_FLAG_SUFFIX = "_exact"
"""A ``distinct_exact`` measure ``m`` reads with a column ``m_exact``: whether its count is exact."""


class MeasureConfig(StrictModel):
    """One measure of an aggregation: exactly one of ``sum``/``min``/``max``/``distinct``/``distinct_exact`` (the
    field) or ``count: "*"``; ``type`` of a numeric measure (default: the field's declared type, else double);
    ``max_values`` of a ``distinct_exact`` measure."""

    sum: FieldName | None = None
    count: Literal["*"] | None = None
    min: FieldName | None = None
    max: FieldName | None = None
    distinct: FieldName | None = None
    """The field whose distinct values are counted, approximately: an HLL sketch (relative standard error about
    1.6 %, a few kB whatever the count)."""
    distinct_exact: FieldName | None = None
    """The field whose distinct values are counted exactly: each partial stores the set of values (merged by union,
    read as its size) while it holds at most ``max_values``; past that, an HLL sketch as ``distinct`` keeps, and the
    measure reads with ``<measure>_exact: false``."""
    type: Literal["double", "long"] | None = None
    max_values: Annotated[StrictInt, Field(gt=0, le=MAX_MAX_VALUES)] | None = None
    """``distinct_exact`` only: the most distinct values a stored partial (an instance's bucket of one key) holds
    (default 100000); a partial that would hold more is stored as an HLL sketch and reads as approximate."""

    @model_validator(mode="after")
    def _one_function(self) -> MeasureConfig:
        given = [f for f in MEASURE_FUNCTIONS if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(f"a measure is exactly one of {', '.join(MEASURE_FUNCTIONS)} (got {', '.join(given) or 'none'})")
        if self.max_values is not None and given[0] != "distinct_exact":
            raise ValueError(f"max_values: a setting of a distinct_exact measure, not of {given[0]}")
        if self.type is not None and given[0] == "distinct_exact":
            raise ValueError("type: a setting of a numeric measure, not of distinct_exact (it counts values as text)")
        return self

    @property
    def function(self) -> str:
        return next(f for f in MEASURE_FUNCTIONS if getattr(self, f) is not None)

    @property
    def source(self) -> str | None:
        """The input field (``None`` for ``count``)."""
        value = getattr(self, self.function)
        return None if value == "*" else value


class OutputConfig(StrictModel):
    """An output of the plan's queries.

    ``key``: the fields that identify a row: an aggregation's grouping keys, a table's key, or the
    fields an event's id is computed from (the same inputs give the same id on every replica).
    ``time``: an event's time field (events are read by time range), the field that buckets the
    facts of an aggregation that has an ``id``, or when a table's contributing row happened (optional; a
    backfill bounds its range by it, :mod:`tandem.batch.backfill`). ``values``: a table's
    numeric value fields; ``merge: sum`` adds the instances' partial values on read. ``id``: the
    fields that identify a row contributing to a table, or a fact of an aggregation computed by the
    sink (``id`` given: each fact is added to its second's partial once, whoever publishes it; without
    ``id`` the query itself emits per-second partials, as the trades plan does).
    """

    kind: Literal["aggregation", "table", "events", "latest", "quarantine"]
    key: list[FieldName] = []
    time: FieldName | None = None
    values: list[FieldName] = []
    merge: Literal["sum"] = "sum"
    id: list[FieldName] = []
    measures: dict[FieldName, MeasureConfig] = {}
    ratios: dict[FieldName, Annotated[list[FieldName], Field(min_length=2, max_length=2)]] = {}
    table: FieldName | None = None
    granularities: list[Literal["second", "minute", "hour", "day", "month", "year"]] = []
    """The buckets an aggregation keeps and serves (default: every one, second to year). Per-second
    partials are always kept: every coarser bucket is rolled up from them."""
    stream: StrictStr | None = None
    """``events``: also publish every event, exactly once, to this ``nats`` stream of the plan, which other
    groups, other plans and outside consumers read (:mod:`tandem.outputs.relay`). The plan's loader checks
    that it names a declared stream."""

    def serving_table(self, plan: str, output: str) -> str:
        """The PostgreSQL table of an aggregation output named ``output``: its ``table``, else ``<plan>_<output>``."""
        return self.table or f"{plan}_{output}"

    @property
    def rules(self) -> OutputRules:
        """What its kind requires and allows of its declaration (:data:`OUTPUT_RULES`)."""
        return OUTPUT_RULES[self.kind]

    @model_validator(mode="after")
    def _kind_fields(self) -> OutputConfig:
        rules, article = self.rules, "an" if self.kind[0] in "aeiou" else "a"
        for name, why in rules.needs.items():
            if not getattr(self, name):
                raise ValueError(f"{article} {self.kind} output needs {why}")
        misplaced = [name for name in DECLARED_OUTPUT_FIELDS
                     if getattr(self, name) and name not in rules.needs and name not in rules.may]
        if misplaced:
            owners = "; ".join(f"{name}: {', '.join(outputs_where(name))}" for name in misplaced)
            raise ValueError(f"{', '.join(misplaced)}: not a setting of {article} {self.kind} output ({owners})")
        if rules.check is not None:
            rules.check(self)
        return self


@dataclass(frozen=True)
class OutputRules:
    """What an output's declaration must and may say, by its kind (:data:`OUTPUT_RULES`). The configuration checks
    them; it sits below the output kinds (:mod:`tandem.outputs`), each of which keeps its rules as ``rules``."""

    needs: dict[str, str]
    """The settings it must give, each with what it is for ("a table output needs <why>")."""
    may: tuple[str, ...] = ()
    """The settings it may give; another kind's are refused."""
    contributions_by_id: bool = False
    """Its rows, when it declares ``id``, are contributions applied once by id (``tandem.output_contributions``,
    kept for ``maintenance.retention.contributions``): a backfill of input older than the ids kept would apply some
    again."""
    check: Callable[[OutputConfig], None] | None = None
    """Its own rules over several settings (a ``ValueError`` says what is wrong)."""


DECLARED_OUTPUT_FIELDS = ("key", "time", "values", "id", "stream", "measures", "ratios", "table", "granularities")
"""The settings of an output beyond its kind: each kind needs some, may give others (:class:`OutputRules`)."""


def _aggregation_rules(output: OutputConfig) -> None:
    if output.id and output.time is None:
        raise ValueError("an aggregation of facts (id) needs the time field that buckets them")
    if not any(m.function == "count" for m in output.measures.values()):
        raise ValueError("an aggregation needs a count measure (a partial covering more events is newer)")
    for name, (numerator, denominator) in output.ratios.items():
        for part in (numerator, denominator):
            if part not in output.measures:
                raise ValueError(f"ratio {name}: {part!r} is not a measure ({', '.join(output.measures)})")
    if len(set(output.granularities)) != len(output.granularities):
        raise ValueError("granularities: each granularity once")
    flags = [f"{name}{EXACT_FLAG_SUFFIX}" for name, measure in output.measures.items()
             if measure.function == "distinct_exact"]
    names = [*output.key, *output.measures, *output.ratios, *flags]
    clashing = sorted({n for n in names if names.count(n) > 1} | set(names) & set(AGGREGATION_COLUMNS))
    if clashing:
        flagged = f" (a distinct_exact measure m reads with m{EXACT_FLAG_SUFFIX})" if set(clashing) & set(flags) else ""
        raise ValueError(f"{', '.join(clashing)}: each key, measure and ratio needs a column name of its own, "
                         f"none of the table's ({', '.join(AGGREGATION_COLUMNS)}){flagged}")


OUTPUT_RULES: dict[str, OutputRules] = {
    "aggregation": OutputRules(
        needs={"measures": "measures, a count among them (a partial covering more events is newer)"},
        may=("key", "time", "id", "ratios", "table", "granularities"), contributions_by_id=True,
        check=_aggregation_rules),
    "table": OutputRules(needs={"key": "a key", "values": "values (the numbers summed over the instances)",
                                "id": "the id of a contributing row (each is applied once)"},
                         may=("time",), contributions_by_id=True),
    "events": OutputRules(needs={"key": "a key (the fields an event's id is computed from)", "time": "a time field"},
                          may=("stream",)),
    "latest": OutputRules(needs={"key": "a key", "time": "the time field that orders its rows",
                                 "values": "the values it keeps of the latest row"}, may=("id",)),
    "quarantine": OutputRules(needs={}),
}
"""The declaration rules of each output kind (one entry per module of :mod:`tandem.outputs`)."""


def outputs_where(setting: str) -> list[str]:
    """The output kinds that need or may give ``setting``, as an error message names them."""
    return [kind for kind, rules in OUTPUT_RULES.items() if setting in rules.needs or setting in rules.may]


# --- pure helpers -------------------------------------------------------------------------------------------


def partition_of(key: Any, partitions: int) -> int:
    """The partition of an event whose key is ``key``: CRC-32 of the key's text (UTF-8), modulo ``partitions``.

    The text of a key is the JSON value as written: a string as is, a number as its decimal
    (``101`` → ``"101"``). Any client writing events must place them the same way.
    """
    text = key if isinstance(key, str) else json.dumps(key)
    return zlib.crc32(text.encode("utf-8")) % partitions


def instance_ids(group: str, parallel: int) -> list[str]:
    """The HA units of a group: ``<group>-1`` … ``<group>-<parallel>``."""
    return [f"{group}-{index}" for index in range(1, parallel + 1)]


def instance_partitions(index: int, parallel: int, partitions: int) -> list[int]:
    """The partitions instance ``index`` (1-based) of a group of ``parallel`` reads: ``p % parallel == index - 1``."""
    if not 1 <= index <= parallel:
        raise ValueError(f"instance {index} of a group of {parallel}")
    return [p for p in range(partitions) if p % parallel == index - 1]


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def event_id(plan: str, output: str, key_values: dict[str, Any]) -> str:
    """A deterministic id of an event from its key fields (the same on every replica and every batching)."""
    text = json.dumps({"plan": plan, "output": output, **{k: _canonical(v) for k, v in sorted(key_values.items())}},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
