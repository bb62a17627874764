"""Parse JSON-lines input and say, for every bad line, why it is bad.

Pure DataFrame functions (streaming or batch). A line is good when it is a JSON object whose
required fields are present, non-null, of the right JSON type, and pass the field's checks.
Otherwise ``reason`` names every problem (``"field 'price' must be > 0 (got -1.5)"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, MapType, StringType, StructField, StructType

from tandem.declarations import FieldConfig, StreamConfig

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

    @property
    def struct(self) -> StructType:
        return StructType([StructField(f.name, f.spark_type) for f in self.fields])


SPARK_TYPES: dict[str, DataType] = {"string": StringType(), "double": DoubleType(), "long": LongType(),
                                     "epoch_millis": LongType()}


def _predicate(operator: str, bound, numeric_nan: bool) -> Callable[[Column], Column]:
    def holds(c: Column) -> Column:
        if operator == "not_empty":
            return F.length(F.trim(c)) > 0
        if operator == "between":
            low, high = bound
            return (c >= low) & (c <= high)
        compared = {">": c > bound, ">=": c >= bound, "<": c < bound, "<=": c <= bound}[operator]
        return compared & ~F.isnan(c) if numeric_nan else compared

    return holds


def field_rule(name: str, config: FieldConfig) -> FieldRule:
    """The parse-and-check rule of one declared field (a double's bounds also refuse NaN)."""
    return FieldRule(name, SPARK_TYPES[config.type], tuple(
        Check(_predicate(operator, bound, config.type == "double"), message)
        for operator, bound, message in config.checks()))


def record_schema(stream: StreamConfig) -> RecordSchema:
    """The record schema of a declared stream, fields in declaration order."""
    return RecordSchema(tuple(field_rule(name, config) for name, config in stream.fields.items()))


def parse_and_validate(lines: DataFrame, schema: RecordSchema) -> DataFrame:
    """``lines(raw, source_file)`` → the parsed fields plus ``raw``, ``source_file`` and ``reason``.

    ``reason`` is null for good lines. Each line is parsed once into the typed fields; only a
    line that fails a check is parsed again, as text, to say which field is missing, of the
    wrong JSON type, or out of range. Needs ``spark.sql.json.enablePartialResults=true`` so one
    bad field does not null the others.
    """
    typed = F.from_json("raw", schema.struct, {"mode": "PERMISSIVE"})
    fields = lines.select("raw", "source_file", typed.alias("_typed")).select(
        "raw", "source_file", *[F.col("_typed")[f.name].alias(f.name) for f in schema.fields])
    good: Column | None = None
    for rule in schema.fields:
        holds = F.col(rule.name).isNotNull()
        if rule.spark_type == StringType():
            holds = holds & _json_string(rule.name, F.col(rule.name))
        for check in rule.checks:
            holds = holds & check.predicate(F.col(rule.name))
        good = holds if good is None else good & holds
    return fields.withColumn("reason", F.when(good, F.lit(None).cast("string")).otherwise(_explain(schema)))


def _json_string(name: str, value: Column) -> Column:
    """Whether the line's field ``name`` holds a JSON string.

    Spark's ``from_json`` turns an object, array, number or boolean into its JSON text when the
    field is declared a string (``{"symbol": {"nested": true}}`` gives ``'{"nested":true}'``). Only
    a value that could be such a text (it starts with ``{``, ``[``, a digit or ``-``, or is
    ``true``/``false``) is looked at again, as a Variant, to learn its JSON type.
    """
    could_be_other = value.rlike(r"^[\[{0-9-]|^(true|false)$")
    json_type = F.schema_of_variant(F.variant_get(F.try_parse_json("raw"), f"$.{name}", "variant"))
    return F.when(value.isNotNull() & could_be_other, json_type == "STRING").otherwise(F.lit(True))


def _explain(schema: RecordSchema) -> Column:
    """Every problem of a bad line, from its text: ``"missing field 'price'; field 'quantity' ..."``."""
    text = F.from_json("raw", MapType(StringType(), StringType()))
    problems: list[Column] = []
    for rule in schema.fields:
        raw_value = text[rule.name]
        value = F.col(rule.name)
        missing = ~F.map_contains_key(text, F.lit(rule.name)) | raw_value.isNull()
        problems.append(F.when(missing, F.lit(f"missing field '{rule.name}'")))
        wrong_type = value.isNull() | ~_json_string(rule.name, value) if rule.spark_type == StringType() \
            else value.isNull()
        problems.append(F.when(~missing & wrong_type, F.concat(
            F.lit(f"field '{rule.name}' is not {_TYPE_NAMES.get(rule.spark_type, rule.spark_type.simpleString())}: "),
            raw_value)))
        for check in rule.checks:
            problems.append(F.when(value.isNotNull() & ~check.predicate(value), F.concat(
                F.lit(f"field '{rule.name}' {check.message} (got "), raw_value, F.lit(")"))))
    return F.when(text.isNull(), F.lit("malformed JSON: not a JSON object")).otherwise(F.concat_ws("; ", *problems))
