"""Parse JSON-lines input and say, for every bad line, why it is bad.

Pure DataFrame functions (streaming or batch). A line is good when it is at most the stream's
``max_line_bytes``, valid UTF-8 without an unpaired UTF-16 surrogate escape, and a JSON object whose
declared fields are present, non-null, of the right JSON type, and pass the field's checks (which
include what no sink can store: NUL in a string, a string over its length, a non-finite double, an
integer outside 64 bits). Otherwise ``reason`` names every problem
(``"field 'price' must be > 0 (got -1.5)"``). Fields that are not declared are skipped, however
deeply they nest; a line over the size limit is not parsed at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, StringType, StructField, StructType, VariantType

from tandem.declarations import DEFAULT_MAX_LINE_BYTES, FieldConfig, StreamConfig

_TYPE_NAMES = {StringType(): "a string", DoubleType(): "a number", LongType(): "an integer"}


@dataclass(frozen=True)
class Check:
    """A rule on a parsed field: ``predicate(col)`` must hold, else ``message`` (value appended)."""

    predicate: Callable[[Column], Column]
    message: str


@dataclass(frozen=True)
class FieldRule:
    name: str
    spark_type: DataType
    checks: tuple[Check, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class RecordSchema:
    fields: tuple[FieldRule, ...]
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    @property
    def struct(self) -> StructType:
        return StructType([StructField(f.name, f.spark_type) for f in self.fields])

    @property
    def json_options(self) -> dict[str, str]:
        """Spark's JSON reader options: a line within the size limit is never refused for its nesting,
        its string or its number lengths (Jackson's defaults refuse 1,000 levels, 20M characters and
        1,000 digits)."""
        limit = str(self.max_line_bytes)
        return {"mode": "PERMISSIVE", "maxNestingDepth": limit, "maxStringLen": limit, "maxNumLen": limit}


SPARK_TYPES: dict[str, DataType] = {"string": StringType(), "double": DoubleType(), "long": LongType(),
                                     "epoch_millis": LongType()}


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
    return FieldRule(name, SPARK_TYPES[config.type], tuple(
        Check(_predicate(operator, bound), message) for operator, bound, message in config.checks()))


def record_schema(stream: StreamConfig) -> RecordSchema:
    """The record schema of a declared stream, fields in declaration order."""
    return RecordSchema(tuple(field_rule(name, config) for name, config in stream.fields.items()),
                        stream.max_line_bytes)


UNPAIRED_SURROGATE = (r"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                      r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?<!\\)(?:\\\\)*\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A ``\\uD800``-``\\uDFFF`` escape that is not half of a pair (an escaped backslash before it does not count):
Spark would store it as ``?`` without a word."""
KEPT_CHARS = 4096
"""How much of a line over the size limit the quarantine keeps (its reason says so)."""
SHOWN_CHARS = 200
"""How much of a bad value a reason quotes."""


def _line_problem(raw: Column, max_line_bytes: int, names: tuple[str, ...]) -> Column:
    """Why a line is refused before it is parsed (null: parse it); ``names``: the declared fields."""
    size = F.octet_length(raw)
    return (F.when(size > max_line_bytes, F.concat(
                F.lit("line of "), size.cast("string"),
                F.lit(f" bytes is over the stream's max_line_bytes ({max_line_bytes}); its first {KEPT_CHARS} "
                      f"characters are kept")))
            .when(~F.is_valid_utf8(raw), F.lit("line is not valid UTF-8 (invalid bytes are kept as U+FFFD)"))
            .when(raw.contains("\\u") & raw.rlike(UNPAIRED_SURROGATE),
                  F.lit("line holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)"))
            .otherwise(_duplicate_fields(raw, names)))


NON_NUMERIC_NUMBER = r"([:\[,])\s*(?:[+-]?(?:Infinity|INF)|NaN)(?=\s*[,\]}])"
"""A JSON value token Spark's reader takes as a double and Jackson's strict parsing refuses."""


def _duplicate_fields(raw: Column, names: tuple[str, ...]) -> Column:
    """Why a JSON object gives a declared field more than once (``duplicate key 'price'``, each such field), else
    null: which of its values is meant is unknowable (Spark would keep one without a word). Keys Tandem does not read
    may repeat.

    Listing a line's keys is a second parse (about 80 % more parsing time): only a line that holds one of the names
    twice as text, or a backslash (a key may be spelled with escapes), is listed; the keys are sorted once, so a line
    of many keys costs n log n, never n². Spark lists the keys of a line nested at most 1,000 levels deep (Jackson's
    default, which ``json_object_keys`` takes no option for): a deeper line's duplicates go unseen here (the
    receiver refuses them).
    """
    if not names:
        return F.lit(None).cast("string")
    suspect = raw.contains("\\")
    for name in names:
        quoted = json.dumps(name)
        first = F.instr(raw, quoted)
        suspect = suspect | ((first > 0) & (F.call_function("locate", F.lit(quoted), raw, first + 1) > 0))
    # Jackson's key listing refuses the non-numeric numbers Spark's reader takes (NaN, Infinity, INF): list the keys
    # of a copy with them as 0 when the line itself cannot be listed
    listed = F.coalesce(F.json_object_keys(raw), F.json_object_keys(F.regexp_replace(raw, NON_NUMERIC_NUMBER, "$1 0")))
    declared = F.filter(listed, lambda key: key.isin(*names))
    ordered = F.array_sort(declared)
    repeated = F.array_distinct(F.filter(ordered, lambda key, i: (i > 0) & (F.element_at(ordered, i) == key)))
    return F.when(suspect & (F.size(declared) != F.size(F.array_distinct(declared))), F.concat_ws("; ", F.transform(
        repeated, lambda key: F.concat(F.lit("duplicate key '"), _shown(key), F.lit("'")))))


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
    valid UTF-8 and without an unpaired surrogate is parsed once into the typed fields; only a line
    that fails a check is parsed again, as text, to say which field is missing, of the wrong JSON
    type, or out of range.
    A bad line's ``raw`` is what the quarantine keeps (:func:`_kept`). Needs
    ``spark.sql.json.enablePartialResults=true`` so one bad field does not null the others.
    """
    line_problem = _line_problem(F.col("raw"), schema.max_line_bytes, tuple(f.name for f in schema.fields))
    parsable = F.when(F.col("_line_problem").isNull(), F.col("raw"))
    typed = F.from_json(parsable, schema.struct, schema.json_options)
    fields = lines.select("raw", "source_file", line_problem.alias("_line_problem")).select(
        "raw", "source_file", "_line_problem", typed.alias("_typed")).select(
        "raw", "source_file", "_line_problem", *[F.col("_typed")[f.name].alias(f.name) for f in schema.fields])
    good: Column = F.col("_line_problem").isNull()
    for rule in schema.fields:
        holds = F.col(rule.name).isNotNull()
        if rule.spark_type == StringType():
            holds = holds & _json_string(schema, rule.name, F.col(rule.name))
        for check in rule.checks:
            holds = holds & check.predicate(F.col(rule.name))
        good = good & holds
    reason = F.when(F.col("valid"), F.lit(None).cast("string")).otherwise(
        F.coalesce(F.col("_line_problem"), _explain(schema)))
    return fields.withColumn("valid", F.coalesce(good, F.lit(False))).withColumn("reason", reason).withColumn(
        "raw", F.when(F.col("valid"), F.col("raw")).otherwise(_kept(F.col("raw"), schema.max_line_bytes))
    ).drop("_line_problem")


def _json_string(schema: RecordSchema, name: str, value: Column) -> Column:
    """Whether the line's field ``name`` holds a JSON string.

    Spark's ``from_json`` turns an object, array, number or boolean into its JSON text when the
    field is declared a string (``{"symbol": {"nested": true}}`` gives ``'{"nested":true}'``). Only
    a value that could be such a text (it starts with ``{``, ``[``, a digit or ``-``, or is
    ``true``/``false``) is read again, as a Variant of that field alone, to learn its JSON type.
    """
    could_be_other = value.rlike(r"^[\[{0-9-]|^(true|false)$")
    return F.when(value.isNotNull() & could_be_other,
                  F.schema_of_variant(_as_variant(schema, name)) == "STRING").otherwise(F.lit(True))


def _shown(value: Column) -> Column:
    """A bad value as a reason quotes it: at most :data:`SHOWN_CHARS` characters (then ``…``)."""
    return F.concat_ws("", F.substring(value, 1, SHOWN_CHARS), F.when(F.length(value) > SHOWN_CHARS, F.lit("…")))


def _wrong_type(rule: FieldRule, raw_value: Column, as_double: Column) -> Column:
    """Why a present value did not parse as the field's type.

    An integer field whose value reads as a double but not as a 64-bit integer is a JSON number past 64
    bits (a string of digits reads as neither: Spark takes only ``"NaN"``-like strings for doubles).
    """
    expected = _TYPE_NAMES.get(rule.spark_type, rule.spark_type.simpleString())
    not_the_type = F.concat(F.lit(f"field '{rule.name}' is not {expected}: "), _shown(raw_value))
    if rule.spark_type != LongType():
        return not_the_type
    outside = F.concat(F.lit(f"field '{rule.name}' is outside the 64-bit integer range: "), _shown(raw_value))
    return F.when(raw_value.rlike(r"^-?[0-9]+$") & as_double[rule.name].isNotNull(), outside).otherwise(not_the_type)


def _as_variant(schema: RecordSchema, name: str) -> Column:
    """The line's field ``name`` alone, as a Variant (its JSON type survives)."""
    return F.from_json("raw", StructType([StructField(name, VariantType())]), schema.json_options)[name]


def _explain(schema: RecordSchema) -> Column:
    """Every problem of a bad line, from its text: ``"missing field 'price'; field 'quantity' ..."``.

    The declared fields are read again as text (a value of another JSON type as its JSON text);
    fields that are not declared are skipped, as in the typed parse.
    """
    as_text = StructType([StructField(rule.name, StringType()) for rule in schema.fields])
    text = F.from_json("raw", as_text, schema.json_options)
    # a JSON object or not: no field can fail to convert here, so only a line that is not one is "corrupt"
    shape = F.from_json("raw", StructType([StructField("_not_an_object", StringType())]),
                        {**schema.json_options, "columnNameOfCorruptRecord": "_not_an_object"})
    integers = [rule.name for rule in schema.fields if rule.spark_type == LongType()]
    as_double = F.from_json("raw", StructType([StructField(name, DoubleType()) for name in integers]),
                            schema.json_options)
    problems: list[Column] = []
    for rule in schema.fields:
        raw_value = text[rule.name]
        value = F.col(rule.name)
        missing = raw_value.isNull()
        problems.append(F.when(missing, F.lit(f"missing field '{rule.name}'")))
        wrong_type = value.isNull() | ~_json_string(schema, rule.name, value) if rule.spark_type == StringType() \
            else value.isNull()
        problems.append(F.when(~missing & wrong_type, _wrong_type(rule, raw_value, as_double)))
        for check in rule.checks:
            problems.append(F.when(value.isNotNull() & ~check.predicate(value), F.concat(
                F.lit(f"field '{rule.name}' {check.message} (got "), _shown(raw_value), F.lit(")"))))
    listed = F.replace(F.concat_ws("; ", *problems), F.lit("\u0000"), F.lit("\\u0000"))  # as a reason quotes NUL
    return F.when(shape.isNull() | shape["_not_an_object"].isNotNull(), F.lit("malformed JSON: not a JSON object")).when(
        listed == "", F.lit("refused by a check that names no field")).otherwise(listed)
