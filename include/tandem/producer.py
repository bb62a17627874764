"""Event producer: JSON-lines files written atomically into landing directories.

A file is written under a hidden temporary name (Spark's file source ignores names starting
with ``.``) in the target directory and renamed into place, so readers never see half a file.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG", "AAPL", "AMZN", "NVDA", "TSLA", "META")


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


BAD_LINES = (
    "{not json",
    '{"symbol": "IBM", "price": "abc", "quantity": 1, "timestamp": %(ts)d}',
    '{"symbol": "IBM", "quantity": 1, "timestamp": %(ts)d}',
    '{"symbol": "IBM", "price": 10.5, "quantity": -3, "timestamp": %(ts)d}',
    '{"symbol": "IBM", "price": -1.25, "quantity": 3, "timestamp": %(ts)d}',
)


def round_robin(events: Sequence[str], shards: Sequence[str]) -> dict[str, list[str]]:
    """Deal events to shards in turn: event i goes to ``shards[i % len(shards)]``."""
    dealt: dict[str, list[str]] = {shard: [] for shard in shards}
    for index, line in enumerate(events):
        dealt[shards[index % len(shards)]].append(line)
    return dealt


def produce(landing: Callable[[str], Path], shards: Sequence[str], *, rate: int, duration_s: float,
            seed: int = 42, bad_ratio: float = 0.0, clock: Callable[[], float] = time.time,
            on_tick: Callable[[int], None] | None = None) -> Iterator[Path]:
    """Write about ``rate`` events per second for ``duration_s`` seconds, one file per shard per tick.

    Event times are the wall clock at the tick. A ``bad_ratio`` share of lines are deliberately
    bad (malformed, wrong type, missing field, negative value) to exercise the quarantine.
    Yields every file written; ``on_tick`` receives the number of lines written at each tick.
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    generator = TradeGenerator(seed)
    started = clock()
    ticks = max(1, round(duration_s))
    for tick in range(ticks):
        now_ms = int(clock() * 1000)
        lines = [
            generator.random.choice(BAD_LINES) % {"ts": now_ms} if generator.random.random() < bad_ratio
            else json.dumps(generator.event(now_ms))
            for _ in range(rate)
        ]
        for shard, shard_lines in round_robin(lines, shards).items():
            if shard_lines:
                yield write_atomically(landing(shard), shard_lines)
        if on_tick:
            on_tick(len(lines))
        delay = started + tick + 1 - clock()
        if delay > 0:
            time.sleep(delay)
