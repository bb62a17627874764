"""Parse JSON-lines input and say, for every bad line, why it is bad.

Pure DataFrame functions (streaming or batch). A line is good when it is at most the stream's
``max_line_bytes``, valid UTF-8 without an unpaired UTF-16 surrogate escape, and a JSON object whose
declared fields are present, non-null, of the right JSON type, and pass the field's checks (which
include what no sink can store: NUL in a string, a string over its length, a non-finite double, an
integer outside 64 bits). Otherwise ``reason`` names every problem
(``"field 'price' must be > 0 (got -1.5)"``). Fields that are not declared are skipped, however
deeply they nest; a line over the size limit is not parsed at all.

Each field reads the JSON key of its ``from`` (a key, or a path into nested objects) and is the column of its
name; a reason names the key as the line spells it (``missing field 'auth.idp'``). A ``timestamp`` is read as a
Variant (an integer and text told apart in the one parse) and becomes epoch milliseconds. The same rules, in the
same words, are written in plain Python for the receiver (:mod:`tandem.event_checks`): the tests run both on the
same cases. A value a reason quotes is written by the receiver's helper (:func:`tandem.event_checks.shown`), and a
line Spark's reader finds no JSON object in is explained by Python's JSON decoder
(:func:`tandem.event_checks.unreadable_line`): Python UDFs in the reasons' projection, which only the quarantine's
bad lines reach (the good lines' queries prune the reasons).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BooleanType, DataType, DoubleType, LongType, StringType, StructField,
                               StructType, VariantType)
from pyspark.sql.udf import UserDefinedFunction

from tandem.declarations import DEFAULT_MAX_LINE_BYTES, EXPECTED, ISO_TIME, FieldConfig, StreamConfig
from tandem.event_checks import WITHOUT_ZONE, shown_text, unreadable_line


@dataclass(frozen=True)
class Check:
    """A rule on a parsed field: ``predicate(col)`` must hold, else ``message`` (value appended)."""

    predicate: Callable[[Column], Column]
    message: str


SPARK_TYPES: dict[str, DataType] = {"string": StringType(), "double": DoubleType(), "long": LongType(),
                                     "boolean": BooleanType(), "epoch_millis": LongType(), "timestamp": LongType()}
"""The column of each field type (a ``timestamp``'s holds epoch milliseconds, as an ``epoch_millis``'s does)."""


@dataclass(frozen=True)
class FieldRule:
    """A declared field: its column ``name``, its ``type`` (:data:`~tandem.declarations.FIELD_TYPES`), its checks and
    the ``keys`` it reads (outermost first)."""

    name: str
    type: str
    checks: tuple[Check, ...] = field(default_factory=tuple)
    keys: tuple[str, ...] = ()
    default: Any = None
    """The value of a line without the field (or with ``null`` there); ``None``: the field is required."""
    former: tuple[str, ...] = ()
    """The keys the field read before a rename (``formerly``), read where the line has no value at :attr:`keys` (no
    key, or ``null``): :func:`value_of`."""
    required_since_ms: int | None = None
    """The event time (epoch milliseconds) from which a line must give the field: the default is for those before."""
    missing: str = ""
    """The reason of a line without the field that must give it (default: ``missing field '<label>'``)."""

    def __post_init__(self) -> None:
        if not self.keys:
            object.__setattr__(self, "keys", (self.name,))
        if not self.missing:
            object.__setattr__(self, "missing", f"missing field '{self.label}'")

    @property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Every path the field reads: its keys, then its former ones."""
        return (self.keys, self.former) if self.former else (self.keys,)

    @property
    def label(self) -> str:
        """The field as a reason names it: its key as the line spells it."""
        return ".".join(self.keys)

    @property
    def spark_type(self) -> DataType:
        """The type of its column."""
        return SPARK_TYPES[self.type]

    @property
    def read_type(self) -> DataType:
        """The type its JSON value is parsed into: its column's, but a Variant for a ``timestamp``."""
        return VariantType() if self.type == "timestamp" else self.spark_type


def nested(leaves: list[tuple[tuple[str, ...], DataType]]) -> StructType:
    """The struct that holds each ``(keys, type)`` leaf at its path (objects in first-seen order) (pure)."""
    tree: dict = {}
    for keys, data_type in leaves:
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = data_type

    def build(node: dict) -> StructType:
        return StructType([StructField(key, build(value) if isinstance(value, dict) else value)
                           for key, value in node.items()])

    return build(tree)


def value_of(column: Column, rule: FieldRule, given: Column | None = None) -> Column:
    """The field's value in a parse of the line: at its keys; at its former ones only where the line gives no value at
    its keys (no key, or ``null``), the receiver's rule (:meth:`tandem.declarations.StreamConfig.value_at`). A value
    of the wrong type at its keys stays the field's (refused: its reason says why), never replaced by the former one.

    ``given``: whether the line gives a value at the field's keys, for a parse that cannot tell it from its value (a
    typed parse nulls a value of the wrong type; a Variant one holds ``null`` as a Variant null:
    :func:`given_in_variant`); without it, ``column`` is a parse as text, null where the line gives no value.
    """
    if not rule.former:
        return at(column, rule.keys)
    if given is None:
        return F.coalesce(at(column, rule.keys), at(column, rule.former))
    return F.when(given, at(column, rule.keys)).otherwise(at(column, rule.former))


def given_in_variant(column: Column, rule: FieldRule) -> Column:
    """Whether a parse of the line as Variants (``column``) holds a value at the field's keys: a JSON ``null`` there is
    a Variant null, not a SQL one."""
    value = at(column, rule.keys)
    return value.isNotNull() & ~F.is_variant_null(value)


def at(column: Column, keys: tuple[str, ...]) -> Column:
    """The field of the struct ``column`` at ``keys`` (a key is a name as it is: dots and all)."""
    for key in keys:
        column = column.getField(key)
    return column


@dataclass(frozen=True)
class RecordSchema:
    fields: tuple[FieldRule, ...]
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    event_time: str | None = None
    """The column of the stream's event time (a field's ``required_since`` is compared with it)."""

    @property
    def struct(self) -> StructType:
        """What one parse of a line reads: every field at its keys, as its :attr:`FieldRule.read_type`."""
        return nested([(path, f.read_type) for f in self.fields for path in f.paths])

    def read(self, leaf: DataType, rules: tuple[FieldRule, ...] | None = None) -> Column:
        """The line parsed once more with every field (or ``rules``) read as ``leaf`` (at its keys)."""
        return F.from_json("raw", nested([(path, leaf) for r in (self.fields if rules is None else rules)
                                          for path in r.paths]),
                           self.json_options)

    @property
    def json_options(self) -> dict[str, str]:
        """Spark's JSON reader options: a line within the size limit is never refused for its nesting,
        its string or its number lengths (Jackson's defaults refuse 1,000 levels, 20M characters and
        1,000 digits)."""
        limit = str(self.max_line_bytes)
        return {"mode": "PERMISSIVE", "maxNestingDepth": limit, "maxStringLen": limit, "maxNumLen": limit}


def _predicate(operator: str, bound) -> Callable[[Column], Column]:
    def holds(c: Column) -> Column:
        if operator == "not_empty":
            return F.length(F.trim(c)) > 0
        if operator == "no_nul":
            return ~c.contains("\u0000")
        if operator == "max_length":
            return F.char_length(c) <= bound
        if operator == "finite":  # Spark orders NaN above +Infinity, so this refuses NaN and both infinities
            return F.abs(c) < F.lit(float("inf"))
        if operator == "between":
            low, high = bound
            return (c >= low) & (c <= high)
        return {">": c > bound, ">=": c >= bound, "<": c < bound, "<=": c <= bound}[operator]

    return holds


def field_rule(name: str, config: FieldConfig) -> FieldRule:
    """The parse-and-check rule of one declared field."""
    return FieldRule(name, config.type, tuple(
        Check(_predicate(operator, bound), message) for operator, bound, message in config.checks()),
        config.path(name), config.default, config.formerly or (), config.required_since_ms,
        config.missing(config.label(name)))


def record_schema(stream: StreamConfig) -> RecordSchema:
    """The record schema of a declared stream, fields in declaration order."""
    return RecordSchema(tuple(field_rule(name, config) for name, config in stream.fields.items()),
                        stream.max_line_bytes, stream.event_time)


_ISO = f"^(?:{ISO_TIME})\\z"
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
"""What ``schema_of_variant`` says of a JSON integer within 64 bits (past them: a DECIMAL or a DOUBLE)."""


@dataclass(frozen=True)
class IsoTime:
    """ISO-8601 text as :func:`tandem.event_checks.iso_millis` reads it, in columns: ``valid`` (the shape of
    :data:`~tandem.declarations.ISO_TIME` and a day its month has), ``zoned`` (``Z`` or an offset given) and
    ``millis`` (epoch milliseconds, meaningful when both hold)."""

    valid: Column
    zoned: Column
    millis: Column


def iso_shape(text: Column) -> tuple[Column, Column]:
    """The two regular expressions :func:`iso_time` needs of ``text``: whether it has the shape of
    :data:`~tandem.declarations.ISO_TIME`, and the digits of its fraction (``""``: none)."""
    return text.rlike(_ISO), F.regexp_extract(text.substr(F.lit(20), F.length(text)), r"^[.,]([0-9]+)", 1)


def iso_time(text: Column, shape: tuple[Column, Column] | None = None) -> IsoTime:
    """:class:`IsoTime` of ``text``; ``shape``: its :func:`iso_shape`, as columns a projection before computed
    (once a row, where its uses here would each compute it again).

    The parts of a shaped text are at fixed places (the date and the time in its first 19 characters; after them
    the fraction, then the zone); each number is at most 4 digits, so no arithmetic can overflow whatever the text.
    The date's days are counted from the Julian day number, in integers: no time zone setting of the session
    takes part.
    """
    shaped, fraction = shape or iso_shape(text)

    def number(start: int, length: int) -> Column:
        return text.substr(start, length).try_cast("long")

    year, month, day, hour, minute, second = (number(1, 4), number(6, 2), number(9, 2), number(12, 2),
                                              number(15, 2), number(18, 2))
    rest = text.substr(F.lit(20), F.length(text))  # [.,]fraction, then Z, +HH:MM, +HHMM or nothing
    zone = rest.substr(F.length(fraction) + F.when(F.length(fraction) > 0, 2).otherwise(1), F.length(rest))
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_days = F.when(month == 2, F.when(leap, 29).otherwise(28)).when(month.isin(4, 6, 9, 11), 30).otherwise(31)
    shift = F.when(month <= 2, 1).otherwise(0)
    y, m = year + 4800 - shift, month + 12 * shift - 3
    days = (day + F.floor((153 * m + 2) / 5) + 365 * y + F.floor(y / 4) - F.floor(y / 100) + F.floor(y / 400)
            - 32045 - 2440588)
    sign = F.when(zone.startswith("-"), -1).otherwise(1)
    offset = F.when(F.length(zone) <= 1, 0).otherwise(
        sign * (zone.substr(2, 2).try_cast("long") * 3600 + F.substring(zone, -2, 2).try_cast("long") * 60))
    millis = ((days * 86400 + hour * 3600 + minute * 60 + second - offset) * 1000
              + F.rpad(fraction.substr(1, 3), 3, "0").try_cast("long"))
    return IsoTime(F.coalesce(shaped & (day <= month_days), F.lit(False)),
                   F.coalesce(shaped & (zone != ""), F.lit(False)), millis)


def _renamed_typed(schema: RecordSchema) -> tuple[FieldRule, ...]:
    """The renamed fields (``formerly``) whose typed parse nulls a value of the wrong type (all but timestamps, read as
    Variants)."""
    return tuple(rule for rule in schema.fields if rule.former and rule.type != "timestamp")


def _with_keys_given(frame: DataFrame, schema: RecordSchema) -> DataFrame:
    """``frame`` with ``_given``: the renamed fields read once more, as text, at their keys, in the lines where the
    typed parse (``_typed``) cannot tell whether the line gives a value there (null at the keys, a value at the former
    ones: a line from before the rename, or one of the wrong type at the keys); null in every other line."""
    renamed = _renamed_typed(schema)
    if not renamed:
        return frame
    typed = F.col("_typed")
    unsure = reduce(lambda a, b: a | b, [at(typed, rule.keys).isNull() & at(typed, rule.former).isNotNull()
                                         for rule in renamed])
    text = F.from_json("raw", nested([(rule.keys, StringType()) for rule in renamed]), schema.json_options)
    return frame.withColumn("_given", F.when(unsure, text))


def _typed_value(rule: FieldRule) -> Column:
    """The field's value in the typed parse (``_typed``, with ``_given``: :func:`_with_keys_given`)."""
    typed = F.col("_typed")
    if rule.type == "timestamp":
        return value_of(typed, rule, given_in_variant(typed, rule))
    if not rule.former:
        return at(typed, rule.keys)
    return value_of(typed, rule, at(typed, rule.keys).isNotNull() | at(F.col("_given"), rule.keys).isNotNull())


def _field_columns(frame: DataFrame, schema: RecordSchema, keep: list[str]) -> DataFrame:
    """``frame``'s ``keep`` columns and a column of each field from its parsed value (``_typed``), in declaration
    order. A timestamp's Variant becomes epoch milliseconds (a JSON integer within 64 bits as it is, ISO-8601 text
    with a zone as its instant, null for anything else: its reason says why, :func:`_wrong_type`) over two more
    projections: its JSON type, integer and text first, then the text's :func:`iso_shape`, so that each is
    computed once a row (used many times in one expression, each use would compute it again: 5x slower)."""
    stamps = [rule for rule in schema.fields if rule.type == "timestamp"]
    frame = _with_keys_given(frame, schema)
    if not stamps:
        return frame.select(*keep, *[_typed_value(rule).alias(rule.name) for rule in schema.fields])

    def part(rule: FieldRule, what: str) -> str:
        return f"_{what}_{schema.fields.index(rule)}"

    parsed = [_typed_value(rule).alias(rule.name) for rule in schema.fields if rule.type != "timestamp"]
    for rule in stamps:
        value = _typed_value(rule)
        parsed += [F.schema_of_variant(value).alias(part(rule, "kind")),
                   F.try_variant_get(value, "$", "long").alias(part(rule, "long")),
                   F.try_variant_get(value, "$", "string").alias(part(rule, "text"))]
    frame = frame.select(*keep, *parsed)
    shapes = [column.alias(part(rule, what)) for rule in stamps
              for what, column in zip(("shaped", "fraction"), iso_shape(F.col(part(rule, "text"))))]
    frame = frame.select("*", *shapes)

    def column(rule: FieldRule) -> Column:
        if rule.type != "timestamp":
            return F.col(rule.name)
        kind = F.col(part(rule, "kind"))
        iso = iso_time(F.col(part(rule, "text")), (F.col(part(rule, "shaped")), F.col(part(rule, "fraction"))))
        return F.when(kind.isin(*_INTEGERS), F.col(part(rule, "long"))).when(
            (kind == "STRING") & iso.valid & iso.zoned, iso.millis).alias(rule.name)

    return frame.select(*keep, *[column(rule) for rule in schema.fields])


UNPAIRED_SURROGATE = (r"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                      r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?<!\\)(?:\\\\)*\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A ``\\uD800``-``\\uDFFF`` escape that is not half of a pair (an escaped backslash before it does not count):
Spark would store it as ``?`` without a word."""
KEPT_CHARS = 4096
"""How much of a line over the size limit the quarantine keeps (its reason says so)."""
SHOWN_CHARS = 200
"""How much of a bad value a reason quotes."""


def _line_problem(raw: Column, schema: RecordSchema) -> Column:
    """Why a line is refused before it is parsed (null: parse it)."""
    size = F.octet_length(raw)
    max_line_bytes = schema.max_line_bytes
    return (F.when(size > max_line_bytes, F.concat(
                F.lit("line of "), size.cast("string"),
                F.lit(f" bytes is over the stream's max_line_bytes ({max_line_bytes}); its first {KEPT_CHARS} "
                      f"characters are kept")))
            .when(~F.is_valid_utf8(raw), F.lit("line is not valid UTF-8 (invalid bytes are kept as U+FFFD)"))
            .when(raw.contains("\\u") & raw.rlike(UNPAIRED_SURROGATE),
                  F.lit("line holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)"))
            .otherwise(_duplicate_keys(raw, schema)))


NON_NUMERIC_NUMBER = r"([:\[,])\s*(?:[+-]?(?:Infinity|INF)|NaN)(?=\s*[,\]}])"
"""A JSON value token Spark's reader takes as a double and Jackson's strict parsing refuses."""


def _duplicate_keys(raw: Column, schema: RecordSchema) -> Column:
    """Why a JSON object gives a key a field reads more than once (``duplicate key 'price'``, ``duplicate key
    'auth.idp'`` for a key of a nested object on a field's path; each such key, sorted), else null: which of its
    values is meant is unknowable (Spark would keep one without a word). Keys Tandem does not read may repeat.

    Listing a line's keys is a second parse (about 80 % more parsing time): only a line that holds one of the keys
    twice as text, or a backslash (a key may be spelled with escapes), is listed; the keys are sorted once, so a line
    of many keys costs n log n, never n². An object on a path (``auth`` of ``auth.idp``) is read once more, as text,
    to list its keys (unless it is a JSON string). Spark lists the keys of a line nested at most 1,000 levels deep
    (Jackson's default, which ``json_object_keys`` takes no option for): a deeper line's duplicates go unseen here
    (the receiver refuses them).
    """
    levels: dict[tuple[str, ...], list[str]] = {}
    for path in (path for rule in schema.fields for path in rule.paths):
        for depth, key in enumerate(path):
            keys = levels.setdefault(path[:depth], [])
            if key not in keys:
                keys.append(key)
    if not levels:
        return F.lit(None).cast("string")
    suspect = raw.contains("\\")
    for key in sorted({key for keys in levels.values() for key in keys}):
        # before its second occurrence: shorter than the line only when it has one (a byte search, where
        # instr and locate walk the line by characters: they made this check a third of the whole parse)
        quoted = json.dumps(key, ensure_ascii=False)
        suspect = suspect | (F.octet_length(F.substring_index(raw, quoted, 2)) < F.octet_length(raw))
    repeated = []
    for prefix, keys in levels.items():
        listed = _keys_of(raw) if not prefix else _keys_of_object(raw, prefix, schema)
        declared = F.filter(listed, lambda key: key.isin(*keys))
        ordered = F.array_sort(declared)
        twice = F.filter(ordered, lambda key, i: (i > 0) & (F.element_at(ordered, i) == key))
        named = F.transform(twice, lambda key: F.concat(F.lit(".".join(prefix) + "."), key)) if prefix else twice
        repeated.append(F.coalesce(named, F.array().cast(ArrayType(StringType()))))
    found = F.array_sort(F.array_distinct(F.concat(*repeated)))
    # ``found`` is used once, in a suspect line's branch only
    return F.when(suspect, F.nullif(F.concat_ws("; ", F.transform(
        found, lambda key: F.concat(F.lit("duplicate key '"), _truncated(key), F.lit("'")))), F.lit("")))


def _keys_of(text: Column) -> Column:
    """The keys of the JSON object ``text`` (null when it is none). Jackson's key listing refuses the non-numeric
    numbers Spark's reader takes (NaN, Infinity, INF): the keys of a copy with them as 0 when the text itself cannot
    be listed."""
    return F.coalesce(F.json_object_keys(text),
                      F.json_object_keys(F.regexp_replace(text, NON_NUMERIC_NUMBER, "$1 0")))


def _keys_of_object(raw: Column, prefix: tuple[str, ...], schema: RecordSchema) -> Column:
    """The keys of the object at ``prefix`` in the line: its JSON text as Spark writes it back (a key given twice
    stays twice); null when the value there is a JSON string (whose text may look like an object)."""
    text = at(F.from_json(raw, nested([(prefix, StringType())]), schema.json_options), prefix)
    value = at(F.from_json(raw, nested([(prefix, VariantType())]), schema.json_options), prefix)
    return F.when(F.coalesce(F.schema_of_variant(value) != "STRING", F.lit(True)), _keys_of(text))


def _kept(raw: Column, max_line_bytes: int) -> Column:
    """What the quarantine keeps of a bad line: valid UTF-8, at most :data:`KEPT_CHARS` of an over-long one."""
    shortened = F.when(F.octet_length(raw) > max_line_bytes, F.substring(raw, 1, KEPT_CHARS)).otherwise(raw)
    return F.make_valid_utf8(shortened)


def parse_and_validate(lines: DataFrame, schema: RecordSchema) -> DataFrame:
    """``lines(raw, source_file)`` → the parsed fields plus ``raw``, ``source_file``, ``valid`` and ``reason``.

    ``valid`` says whether a line is good (never null: a check that yields null refuses the line, so
    every line is either good or quarantined); ``reason`` is null for good lines. A query of good
    lines filters on ``valid``: Spark then prunes the reasons from its plan, whose size costs every
    micro-batch (planning a query with them took 0.3 s more a batch). A line within the size limit,
    valid UTF-8 and without an unpaired surrogate is parsed once into the typed fields (each read at
    its keys, a column of its name); only a line that fails a check is parsed again, as text, to say
    which field is missing, of the wrong JSON type, or out of range.
    A bad line's ``raw`` is what the quarantine keeps (:func:`_kept`). Needs
    ``spark.sql.json.enablePartialResults=true`` so one bad field does not null the others.
    """
    line_problem = _line_problem(F.col("raw"), schema)
    parsable = F.when(F.col("_line_problem").isNull(), F.col("raw"))
    typed = F.from_json(parsable, schema.struct, schema.json_options)
    keep = ["raw", "source_file", "_line_problem"]
    fields = _field_columns(lines.select("raw", "source_file", line_problem.alias("_line_problem")).select(
        *keep, typed.alias("_typed")), schema, keep)
    fields = _with_defaults(fields, schema)
    good: Column = F.col("_line_problem").isNull()
    for rule in schema.fields:
        holds = F.col(rule.name).isNotNull()
        if rule.type == "string":
            holds = holds & _json_string(schema, rule, F.col(rule.name))
        for check in rule.checks:
            holds = holds & check.predicate(F.col(rule.name))
        good = good & holds
    reason = F.when(F.col("valid"), F.lit(None).cast("string")).otherwise(
        F.coalesce(F.col("_line_problem"), _explain(schema)))
    return fields.withColumn("valid", F.coalesce(good, F.lit(False))).withColumn("reason", reason).withColumn(
        "raw", F.when(F.col("valid"), F.col("raw")).otherwise(_kept(F.col("raw"), schema.max_line_bytes))
    ).drop("_line_problem")


def _with_defaults(fields: DataFrame, schema: RecordSchema) -> DataFrame:
    """Each field with a default holds it where the line gives no value (no key, or ``null``); a value of the wrong
    type stays null (refused, its reason says why). Only a line with such a field null is parsed again (as text)
    to tell the two apart."""
    defaulted = tuple(rule for rule in schema.fields if rule.default is not None)
    if not defaulted:
        return fields
    any_null = reduce(lambda a, b: a | b, [F.col(rule.name).isNull() for rule in defaulted])
    given = F.when(F.col("_line_problem").isNull() & any_null, schema.read(StringType(), defaulted))
    return fields.withColumns({rule.name: F.when(F.col(rule.name).isNull() & F.col("_line_problem").isNull()
                                                 & value_of(given, rule).isNull() & _before_required(schema, rule),
                                                 F.lit(rule.default).cast(rule.spark_type)).otherwise(F.col(rule.name))
                               for rule in defaulted})


def _before_required(schema: RecordSchema, rule: FieldRule) -> Column:
    """Whether a line may go without the field (its default then applies): always, or only a line whose event time
    is before the field's ``required_since`` (null, so not, when the line's event time is not known)."""
    if rule.required_since_ms is None:
        return F.lit(True)
    return F.col(schema.event_time) < F.lit(rule.required_since_ms)


def _json_string(schema: RecordSchema, rule: FieldRule, value: Column) -> Column:
    """Whether the line's field holds a JSON string.

    Spark's ``from_json`` turns an object, array, number or boolean into its JSON text when the
    field is declared a string (``{"symbol": {"nested": true}}`` gives ``'{"nested":true}'``). Only
    a value that could be such a text (it starts with ``{``, ``[``, a digit or ``-``, or is
    ``true``/``false``) is read again, as a Variant of that field alone, to learn its JSON type. A field with a
    default that the line does not give (no key, or ``null``) holds the default, a string.
    """
    could_be_other = F.left(value, F.lit(1)).isin("[", "{", "-", *"0123456789") | value.isin("true", "false")
    given = ("STRING", "VOID") if rule.default is not None else ("STRING",)  # no value or null: the default's
    kind = F.schema_of_variant(_as_variant(schema, rule))
    return F.when(value.isNotNull() & could_be_other,
                  F.coalesce(kind.isin(*given), F.lit(rule.default is not None))).otherwise(F.lit(True))


def _truncated(text: Column) -> Column:
    """``text`` in a reason: at most :data:`SHOWN_CHARS` characters (then ``…``)."""
    return F.concat_ws("", F.substring(text, 1, SHOWN_CHARS), F.when(F.length(text) > SHOWN_CHARS, F.lit("…")))


def _shown_value(schema: RecordSchema, rule: FieldRule, raw_value: Column) -> Column:
    """The field's value as a reason quotes it (``raw_value``: the line's field read as text), written by
    :func:`tandem.event_checks.shown`, the receiver's one helper (:data:`SHOWN_TEXT`): a string in double quotes (the
    field's own parse as a Variant tells a string: ``"true"`` is not ``true``), a number as Python writes it."""
    is_string = F.coalesce(F.schema_of_variant(_as_variant(schema, rule)) == "STRING", F.lit(False))
    return SHOWN_TEXT(raw_value, is_string)


SHOWN_TEXT = UserDefinedFunction(shown_text, StringType(), "shown_text")
"""A value Spark's reader gave as text, as :func:`tandem.event_checks.shown` writes it (``1796680000.5``, not Java's
``1.7966800005E9``): a Python UDF, in the projection of the reasons, which only a quarantine asks for, after its
filter of bad lines (:func:`tandem.event_checks.shown_text`)."""


def _wrong_type(schema: RecordSchema, rule: FieldRule, raw_value: Column, as_double: Column, given: Column) -> Column:
    """Why a present value did not parse as the field's type (``given``: whether the line gives a value at the field's
    keys, not only at its former ones).

    An integer field whose value reads as a double but not as a 64-bit integer is a JSON number past 64
    bits (a string of digits reads as neither: Spark takes only ``"NaN"``-like strings for doubles). A
    timestamp's ISO-8601 text without a zone is told so.
    """
    not_the_type = F.concat(F.lit(f"field '{rule.label}' is not {EXPECTED[rule.type]}: "),
                            _shown_value(schema, rule, raw_value))
    if rule.type == "timestamp":
        iso = iso_time(raw_value)
        without_zone = F.concat(F.lit(f"field '{rule.label}' {WITHOUT_ZONE}: "), _shown_value(schema, rule, raw_value))
        return F.when(iso.valid & ~iso.zoned & (F.schema_of_variant(_as_variant(schema, rule)) == "STRING"),
                      without_zone).otherwise(not_the_type)
    if rule.type not in ("long", "epoch_millis"):
        return not_the_type
    outside = F.concat(F.lit(f"field '{rule.label}' is outside the 64-bit integer range: "),
                       _shown_value(schema, rule, raw_value))
    return F.when(raw_value.rlike(r"^-?[0-9]+$") & value_of(as_double, rule, given).isNotNull(), outside) \
        .otherwise(not_the_type)


def _as_variant(schema: RecordSchema, rule: FieldRule) -> Column:
    """The line's field alone, as a Variant (its JSON type survives)."""
    parsed = schema.read(VariantType(), (rule,))
    return value_of(parsed, rule, given_in_variant(parsed, rule))


def _explain(schema: RecordSchema) -> Column:
    """Every problem of a bad line, from its text: ``"missing field 'price'; field 'quantity' ..."``.

    The declared fields are read again as text (a value of another JSON type as its JSON text);
    fields that are not declared are skipped, as in the typed parse.
    """
    text = schema.read(StringType())
    # a JSON object or not: no field can fail to convert here, so only a line that is not one is "corrupt"
    shape = F.from_json("raw", StructType([StructField("_not_an_object", StringType())]),
                        {**schema.json_options, "columnNameOfCorruptRecord": "_not_an_object"})
    integers = tuple(rule for rule in schema.fields if rule.type in ("long", "epoch_millis"))
    as_double = schema.read(DoubleType(), integers) if integers else F.lit(None)
    problems: list[Column] = []
    for rule in schema.fields:
        raw_value = value_of(text, rule)
        given = at(text, rule.keys).isNotNull()
        value = F.col(rule.name)
        missing = raw_value.isNull()
        if rule.default is None:
            problems.append(F.when(missing, F.lit(rule.missing)))
        elif rule.required_since_ms is not None:
            problems.append(F.when(missing & ~_before_required(schema, rule), F.lit(rule.missing)))
        wrong_type = value.isNull() | ~_json_string(schema, rule, value) if rule.type == "string" \
            else value.isNull()
        problems.append(F.when(~missing & wrong_type, _wrong_type(schema, rule, raw_value, as_double, given)))
        for check in rule.checks:
            problems.append(F.when(value.isNotNull() & ~check.predicate(value), F.concat(
                F.lit(f"field '{rule.label}' {check.message} (got "), _shown_value(schema, rule, raw_value),
                F.lit(")"))))
    listed = F.replace(F.concat_ws("; ", *problems), F.lit("\u0000"), F.lit("\\u0000"))  # as a reason quotes NUL
    no_object = shape.isNull() | shape["_not_an_object"].isNotNull()
    # the UDF runs on every row of its projection, whatever the branch: it is given the lines Spark finds no object in
    return F.coalesce(UNREADABLE_LINE(F.when(no_object, F.col("raw"))), F.when(
        listed == "", F.lit("refused by a check that names no field")).otherwise(listed))


UNREADABLE_LINE = UserDefinedFunction(unreadable_line, StringType(), "unreadable_line")
"""Why a line is not a JSON object, in Python's JSON decoder's words (:func:`tandem.event_checks.unreadable_line`;
null for a null line). Evaluated in the projection of the reasons, which only a quarantine asks for, after its
filter of bad lines."""
