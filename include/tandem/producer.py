"""Event producers: realistic events for every stream of a plan, written through the partition layout.

Every event goes to partition :func:`tandem.declarations.partition_of` of its key, of its stream's
source kind (:class:`Destinations`, :mod:`tandem.sources`): a ``files`` stream's
``landing/<stream>/<partition>/``, a file written under a hidden temporary name and renamed into place, so readers
never see half a file; a ``nats`` stream's subject ``<prefix>.<stream>.<partition>``, each event with a
``Nats-Msg-Id`` of its own, so that a retry is not a second event, and acknowledged by JetStream before the call
returns. A plan's module may define its own generator (``generator(seed)``);
others get :class:`DeclaredGenerator`. The same seed gives the same events.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.config import ClusterConfig, PlanConfig
from tandem.declarations import TIME_TYPES, FieldConfig, StreamConfig, partition_of
from tandem.errors import ConfigError, TandemError
from tandem.sources import source_of
from tandem.sources.base import StreamWriter


class Destinations:
    """Where a plan's lines go, stream by stream, as its source kind writes them
    (:meth:`~tandem.sources.base.SourceKind.writer`): the landing folders of a ``files`` stream, the JetStream
    subjects of a ``nats`` stream. Holds each kind's writer (a NATS connection): close it (a context manager)."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig) -> None:
        self.cluster = cluster
        self.plan = plan
        self._writers: dict[str, StreamWriter] = {}

    def write(self, stream: str, partition: int, lines: Sequence[str], ids: Sequence[str] | None = None) -> str:
        """Write ``lines`` to one partition of ``stream``; return where (a file, or ``nats:<subject>:<first>..<last>``).

        ``ids``: the message id of each line (``nats``; default a new one each): a line published again
        with its id within the stream's duplicate window is not a second event.
        """
        publisher = self.plan.publisher_of(stream)
        if publisher is not None:
            raise ConfigError(str(self.plan.path), f"outputs.{publisher}.stream", f"stream {stream} is published by "
                              f"output {publisher}: only Tandem writes to it (exactly once), producers do not")
        if self.plan.from_plan(stream) is not None:
            raise ConfigError(str(self.plan.path), f"streams.{stream}.from_plan", f"stream {stream} is plan "
                              f"{self.plan.from_plan(stream)}'s: this plan only reads it, producers write to that plan")
        kind = source_of(self.plan, stream)
        if kind.name not in self._writers:
            self._writers[kind.name] = kind.writer(self.cluster, self.plan)
        return self._writers[kind.name].write(stream, partition, lines, ids)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __enter__(self) -> Destinations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventGenerator(Protocol):
    random: random.Random

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        """About ``count`` new events at wall-clock ``now_ms``, by stream."""


@dataclass
class DeclaredGenerator:
    """Events drawn from a plan's stream declarations: every field a valid value of its type and checks.

    The generator of a plan whose module defines none: keys from a small pool (so keyed state and
    tables see the same keys again), numbers inside their bounds, event times about the wall clock, and a value
    of its own in every event for a field that identifies an output's rows (:func:`unique_fields`), so that N
    events make N rows.
    """

    plan: PlanConfig
    seed: int = 42
    keys: int = 16

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.unique = unique_fields(self.plan)
        self._issued: int | None = None

    def next_unique(self, now_ms: int) -> int:
        """A number this generator never gave before, nor a run started earlier on this clock (its first call's time
        in microseconds, counted up one a value)."""
        self._issued = now_ms * 1000 if self._issued is None else self._issued + 1
        return self._issued

    def value(self, stream: StreamConfig, name: str, now_ms: int) -> Any:
        """A value of field ``name`` that passes every check declared for it."""
        declared = stream.fields[name]
        if declared.type in TIME_TYPES:
            return now_ms - self.random.randint(0, 1000)
        if declared.type == "boolean":
            return self.random.random() < 0.5
        if name in self.unique and declared.type in ("string", "long"):
            return unique_value(declared, name, self.next_unique(now_ms))
        if declared.type == "string":
            pool = self.keys if name == stream.key else 8
            return f"{name[:8]}-{self.random.randrange(pool)}"[:declared.length_limit]
        low, high = numeric_range(declared.greater_than, declared.at_least, declared.less_than, declared.at_most,
                                  integer=declared.type == "long")
        if name == stream.key and declared.type == "long":
            return low + self.random.randrange(min(self.keys, high - low + 1))
        return self.random.randint(low, high) if declared.type == "long" else round(self.random.uniform(low, high), 3)

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        streams = {name: self.plan.streams[name] for name in self.plan.input_streams}
        return {name: [{field_name: self.value(stream, field_name, now_ms) for field_name in stream.fields}
                       for _ in range(count)] for name, stream in streams.items()}


def unique_fields(plan: PlanConfig) -> frozenset[str]:
    """The fields whose every produced event gets a value of its own (pure): those that make the id of an output
    published once by id (its ``id`` fields, or an events output's ``key``), when that id has no field that already
    varies from event to event (a time, a ``double``). A key keeps its small pool of values, so that keyed state,
    joins and aggregations see the same keys again: no stream's ``key`` or event time, and no grouping key of an
    output (the ``key`` of one that has an ``id``) is made unique. Fields are matched by name."""
    from tandem.outputs import kind_of

    fields = {name: field for stream in plan.streams.values() for name, field in stream.fields.items()}
    kept = {name for stream in plan.streams.values() for name in (stream.key, stream.event_time)}
    kept |= {name for output in plan.outputs.values() if output.id for name in output.key}
    unique: set[str] = set()
    for name, output in plan.outputs.items():
        identity = output.id or output.key
        if not identity or not kind_of(plan, name).published_by_id(output):
            continue
        if any(fields[f].type in (*TIME_TYPES, "double") for f in identity if f in fields):
            continue
        unique |= {f for f in identity if f in fields and f not in kept}
    return frozenset(unique)


def unique_value(declared: FieldConfig, name: str, number: int) -> str | int:
    """``number`` as a value of the declared ``string`` or ``long`` field ``name`` that passes its checks (pure): a
    different number gives a different value (within a ``long``'s declared bounds, modulo their width)."""
    if declared.type == "long":
        low, high = long_range(declared)
        return number if low <= number <= high else low + (number - low) % (high - low + 1)
    text = f"{name[:8]}-{number}"
    limit = declared.length_limit or len(text)
    return text if len(text) <= limit else str(number)[-limit:]


def long_range(declared: FieldConfig) -> tuple[int, int]:
    """The whole room of a ``long`` field's declared bounds (pure; unbounded: the 64-bit range, from 0 up when only
    an upper bound is missing)."""
    lows = [b for b in (declared.at_least, None if declared.greater_than is None else declared.greater_than + 1)
            if b is not None]
    highs = [b for b in (declared.at_most, None if declared.less_than is None else declared.less_than - 1)
             if b is not None]
    high = math.floor(min(highs)) if highs else 2**63 - 1
    low = math.ceil(max(lows)) if lows else (0 if high >= 0 else -2**63)
    return low, high


def numeric_range(greater_than: float | None, at_least: float | None, less_than: float | None,
                  at_most: float | None, *, integer: bool) -> tuple[float, float]:
    """A closed range of values inside the declared bounds (pure): 1000 wide, or the whole room between them."""
    step = 1 if integer else 0.001
    lows = [b for b in (at_least, None if greater_than is None else greater_than + step) if b is not None]
    highs = [b for b in (at_most, None if less_than is None else less_than - step) if b is not None]
    low = max(lows) if lows else (min(highs) - 1000 if highs else 0)
    high = min(highs) if highs else low + 1000
    if integer:
        low, high = math.ceil(low), math.floor(high)
    if low > high:
        raise TandemError(f"no value fits the bounds > {greater_than}, >= {at_least}, < {less_than}, <= {at_most}")
    return low, high


def generator_for(plan: PlanConfig, seed: int) -> EventGenerator:
    """The plan's sample-event generator: its module's ``generator(seed)``, else :class:`DeclaredGenerator`."""
    from tandem.runtime.plan_api import plan_hook

    make = plan_hook(plan, "generator")
    return make(seed) if make is not None else DeclaredGenerator(plan, seed)


def event_line(stream: StreamConfig, event: dict[str, Any]) -> str:
    """``event`` (values by field name) as a line of ``stream``: each field at the key it reads (its ``from``)."""
    return json.dumps(stream.event_of(event))


def bad_line(stream: StreamConfig, good: dict[str, Any], rng: random.Random) -> str:
    """A deliberately bad line of ``stream``: malformed JSON, a missing field, a wrong type or a failed check."""
    name = rng.choice(list(stream.fields))
    kind = rng.choice(("malformed", "missing", "type", "check"))
    broken = dict(good)
    if kind == "malformed":
        return event_line(stream, good)[:-3]
    if kind == "missing" and stream.fields[name].default is None:
        broken.pop(name)
    elif kind == "missing":  # a field with a default may be missing: give it a value of another type instead
        broken[name] = "abc" if stream.fields[name].type != "string" else {"nested": True}
    elif kind == "type" or stream.fields[name].type == "string" and not stream.fields[name].not_empty:
        broken[name] = "abc" if stream.fields[name].type != "string" else {"nested": True}
    else:
        checks = stream.fields[name].checks()
        broken[name] = _violating(*checks[0][:2]) if checks else "abc"
    return event_line(stream, broken)


def _violating(operator: str, bound: Any) -> Any:
    """A value that fails the check ``operator bound``."""
    if operator == "not_empty":
        return "  "
    if operator == "no_nul":
        return "a\u0000b"
    if operator == "max_length":
        return "x" * (bound + 1)
    if operator == "finite":
        return float("inf")  # json.dumps writes Infinity, which Spark's JSON reader takes as a double
    if operator == "between":
        return bound[0] - 5
    return bound - 1 if operator in (">", ">=") else bound + 1


def partitioned(plan: PlanConfig, lines_by_stream: dict[str, list[tuple[dict[str, Any], str]]]
                ) -> dict[tuple[str, int], list[str]]:
    """Lines grouped by ``(stream, partition)``: the partition of each event's key (bad lines keep theirs)."""
    out: dict[tuple[str, int], list[str]] = {}
    for stream, items in lines_by_stream.items():
        declared = plan.streams[stream]
        for event, line in items:
            partition = partition_of(event[declared.key], declared.partitions)
            out.setdefault((stream, partition), []).append(line)
    return out


def advance_watermark(cluster: ClusterConfig, plan: PlanConfig, at_ms: int, seed: int = 0) -> list[str]:
    """Write one event at ``at_ms`` into every partition of every input stream, with a key that belongs there.

    Results are emitted once the watermark passes them; when the input stops, these events (say an
    hour ahead) move every instance's watermark past everything written, so every result is final.
    The events are real events of their stream (keys ``~watermark-<n>`` or ``1000000 + n``).
    """
    template = generator_for(plan, seed).events(at_ms, 1)
    written = []
    with Destinations(cluster, plan) as out:
        for stream in plan.input_streams:
            written += _watermark_events(out, stream, plan.streams[stream], template, at_ms)
    return written


def _watermark_events(out: Destinations, stream: str, declared: StreamConfig, template: dict[str, list[dict]],
                      at_ms: int) -> list[str]:
    """One event at ``at_ms`` in every partition of ``stream``, shaped like the generator's events."""
    base = (template.get(stream) or [None])[0] or next(e for events in template.values() for e in events)
    event = {name: base.get(name, "~") for name in declared.fields}
    numeric = declared.fields[declared.key].type != "string"
    placed: dict[int, Any] = {}
    n = 0
    while len(placed) < declared.partitions:
        key = 1_000_000 + n if numeric else f"~watermark-{n}"
        placed.setdefault(partition_of(key, declared.partitions), key)
        n += 1
    return [out.write(stream, partition, [event_line(declared, {**event, declared.key: key,
                                                                declared.event_time: at_ms})])
            for partition, key in sorted(placed.items())]


def produce(cluster: ClusterConfig, plan: PlanConfig, *, rate: int, duration_s: float, seed: int = 42,
            bad_ratio: float = 0.0, clock: Callable[[], float] = time.time,
            on_tick: Callable[[dict[str, list[tuple[dict, str]]]], None] | None = None) -> Iterator[str]:
    """Write about ``rate`` events per second for ``duration_s`` seconds, one write per partition per tick (a
    file, or a pipelined publish to the partition's subject).

    Event times are about the wall clock at the tick. A ``bad_ratio`` share of lines are
    deliberately bad, to exercise the quarantine. Yields where each write went; ``on_tick`` receives
    each tick's ``{stream: [(event, line written)]}`` (a bad line differs from :func:`event_line`'s).
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    if not 0 <= bad_ratio <= 1:
        raise ValueError("bad ratio must be between 0 and 1")
    generator = generator_for(plan, seed)
    started = clock()
    ticks = max(1, round(duration_s))
    with Destinations(cluster, plan) as out:
        for tick in range(ticks):
            now_ms = int(clock() * 1000)
            by_stream = {
                stream: [(event, bad_line(plan.streams[stream], event, generator.random)
                          if generator.random.random() < bad_ratio else event_line(plan.streams[stream], event))
                         for event in events]
                for stream, events in generator.events(now_ms, rate).items()}
            for (stream, partition), lines in sorted(partitioned(plan, by_stream).items()):
                yield out.write(stream, partition, lines)
            if on_tick:
                on_tick(by_stream)
            delay = started + tick + 1 - clock()
            if delay > 0:
                time.sleep(delay)
