"""Event producers: realistic events for every stream of a plan, written through the partition layout.

Every event goes to ``landing/<stream>/<partition>/`` with ``partition =``
:func:`tandem.declarations.partition_of` of its key. A file is written under a hidden temporary
name (Spark's file source ignores names starting with ``.``) and renamed into place, so readers
never see half a file. One generator per plan makes the events (:data:`GENERATORS`); the same
seed gives the same events.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tandem.config import ClusterConfig, PlanConfig
from tandem.declarations import StreamConfig, partition_of
from tandem.errors import TandemError
from tandem.layout import landing_dir

SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG", "AAPL", "AMZN", "NVDA", "TSLA", "META")
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")


def write_atomically(directory: Path, lines: Sequence[str], prefix: str = "events") -> Path:
    """Write ``lines`` as one new ``.jsonl`` file in ``directory``, atomically (temp file + rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{prefix}-{time.time_ns()}-{uuid.uuid4().hex[:8]}.jsonl"
    temporary = directory / f".{name}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    final = directory / name
    os.rename(temporary, final)
    return final


class EventGenerator(Protocol):
    random: random.Random

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        """About ``count`` new events at wall-clock ``now_ms``, by stream."""


@dataclass
class TradeGenerator:
    """Reproducible trade events: the same seed gives the same symbols, prices and quantities."""

    seed: int = 42
    symbols: Sequence[str] = SYMBOLS

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.prices = {s: 50.0 + 10.0 * i for i, s in enumerate(self.symbols)}

    def event(self, timestamp_ms: int) -> dict[str, Any]:
        symbol = self.random.choice(self.symbols)
        self.prices[symbol] = max(1.0, round(self.prices[symbol] * (1 + self.random.uniform(-0.01, 0.01)), 2))
        return {"symbol": symbol, "price": self.prices[symbol], "quantity": self.random.randint(1, 500),
                "timestamp": timestamp_ms}

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        return {"trades": [self.event(now_ms) for _ in range(count)]}


@dataclass
class PizzaGenerator:
    """Orders, and for each a delivery on time (within 30 s), late, or never; order times a little out of order."""

    seed: int = 42
    on_time: float = 0.7
    late: float = 0.2
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.counter = 0
        self.run_ms: int | None = None  # order numbers of two runs (two `tandem produce`, two demos) never meet

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        orders = []
        for _ in range(count):
            self.counter += 1
            self.run_ms = self.run_ms or now_ms
            order = {"order_no": f"o{self.run_ms}-{self.counter}", "customer_name": self.random.choice(CUSTOMERS),
                     "time": now_ms - self.random.randint(0, 2000)}
            orders.append(order)
            draw = self.random.random()
            if draw < self.on_time + self.late:
                delay = self.random.randint(1000, 28000) if draw < self.on_time else self.random.randint(32000, 60000)
                self.pending.append((order["time"] + delay, {"order_no": order["order_no"],
                                                             "time": order["time"] + delay}))
        due = [delivery for at, delivery in self.pending if at <= now_ms]
        self.pending = [(at, delivery) for at, delivery in self.pending if at > now_ms]
        return {"orders": orders, "deliveries": due}


@dataclass
class TemperatureGenerator:
    """Rooms 100–119 with a few devices each; temperatures drift, sometimes jump (alerts) or run hot (> 40)."""

    seed: int = 42
    rooms: Sequence[int] = tuple(range(100, 120))
    jump: float = 0.03

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.temps = {room: 20.0 + self.random.uniform(-2, 2) for room in self.rooms}

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        out = []
        for _ in range(count):
            room = self.random.choice(self.rooms)
            step = self.random.uniform(5.5, 12) if self.random.random() < self.jump else self.random.uniform(-0.6, 0.6)
            self.temps[room] = min(70.0, max(-10.0, self.temps[room] + step))
            if self.temps[room] > 45 and self.random.random() < 0.3:
                self.temps[room] = 22.0  # someone opened a window
            out.append({"room_no": room, "device_id": f"dev-{room}-{self.random.randint(1, 3)}",
                        "temp": round(self.temps[room], 2), "time": now_ms - self.random.randint(0, 1500)})
        return {"temps": out}


GENERATORS: dict[str, Callable[[int], EventGenerator]] = {
    "trades": TradeGenerator, "pizza_shop": PizzaGenerator, "temperatures": TemperatureGenerator}


def generator_for(plan: PlanConfig, seed: int) -> EventGenerator:
    try:
        return GENERATORS[plan.name](seed)
    except KeyError:
        raise TandemError(f"no event generator for plan {plan.name!r} (generators: {', '.join(GENERATORS)})") from None


def bad_line(stream: StreamConfig, good: dict[str, Any], rng: random.Random) -> str:
    """A deliberately bad line of ``stream``: malformed JSON, a missing field, a wrong type or a failed check."""
    name = rng.choice(list(stream.fields))
    kind = rng.choice(("malformed", "missing", "type", "check"))
    broken = dict(good)
    if kind == "malformed":
        return json.dumps(good)[:-3]
    if kind == "missing":
        broken.pop(name)
    elif kind == "type" or stream.fields[name].type == "string" and not stream.fields[name].not_empty:
        broken[name] = "abc" if stream.fields[name].type != "string" else {"nested": True}
    else:
        checks = stream.fields[name].checks()
        broken[name] = _violating(*checks[0][:2]) if checks else "abc"
    return json.dumps(broken)


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


def advance_watermark(cluster: ClusterConfig, plan: PlanConfig, at_ms: int, seed: int = 0) -> list[Path]:
    """Write one event at ``at_ms`` into every partition of every stream, with a key that belongs there.

    Results are emitted once the watermark passes them; when the input stops, these events (say an
    hour ahead) move every instance's watermark past everything written, so every result is final.
    The events are real events of their stream (keys ``~watermark-<n>`` or ``1000000 + n``).
    """
    template = generator_for(plan, seed).events(at_ms, 1)
    written = []
    for stream, declared in plan.streams.items():
        base = (template.get(stream) or [None])[0] or next(e for events in template.values() for e in events)
        event = {name: base.get(name, "~") for name in declared.fields}
        numeric = declared.fields[declared.key].type != "string"
        placed: dict[int, Any] = {}
        n = 0
        while len(placed) < declared.partitions:
            key = 1_000_000 + n if numeric else f"~watermark-{n}"
            placed.setdefault(partition_of(key, declared.partitions), key)
            n += 1
        for partition, key in sorted(placed.items()):
            line = json.dumps({**event, declared.key: key, declared.event_time: at_ms})
            written.append(write_atomically(landing_dir(cluster, stream, partition), [line]))
    return written


def produce(cluster: ClusterConfig, plan: PlanConfig, *, rate: int, duration_s: float, seed: int = 42,
            bad_ratio: float = 0.0, clock: Callable[[], float] = time.time,
            on_tick: Callable[[dict[str, list[tuple[dict, str]]]], None] | None = None) -> Iterator[Path]:
    """Write about ``rate`` events per second for ``duration_s`` seconds, one file per partition per tick.

    Event times are about the wall clock at the tick. A ``bad_ratio`` share of lines are
    deliberately bad, to exercise the quarantine. Yields every file written; ``on_tick`` receives
    each tick's ``{stream: [(event, line written)]}`` (a bad line differs from ``json.dumps(event)``).
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    if not 0 <= bad_ratio <= 1:
        raise ValueError("bad ratio must be between 0 and 1")
    generator = generator_for(plan, seed)
    started = clock()
    ticks = max(1, round(duration_s))
    for tick in range(ticks):
        now_ms = int(clock() * 1000)
        by_stream = {
            stream: [(event, bad_line(plan.streams[stream], event, generator.random)
                      if generator.random.random() < bad_ratio else json.dumps(event)) for event in events]
            for stream, events in generator.events(now_ms, rate).items()}
        for (stream, partition), lines in sorted(partitioned(plan, by_stream).items()):
            yield write_atomically(landing_dir(cluster, stream, partition), lines)
        if on_tick:
            on_tick(by_stream)
        delay = started + tick + 1 - clock()
        if delay > 0:
            time.sleep(delay)
