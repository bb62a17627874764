"""The temperature plan (reference seed 002): room averages, rising-temperature alerts, high temperatures.

Stream ``temps {room_no, device_id, temp, time}``, partitioned by ``room_no``, so a room's
readings all reach one instance of each group.

- ``avg_temps`` (group-1): for every reading of room r at time t, the average and count of room
  r's readings with time in ``(t − 2 min, t]``.
- ``temp_alerts`` (group-1): for every reading e1 of room r, the earliest reading e2 of room r with
  ``e1.time < e2.time ≤ e1.time + 10 min`` and ``e2.temp ≥ e1.temp + 5`` gives one alert.
- ``high_temps`` (group-2, parallel 2): every reading with ``100 ≤ room_no < 110`` and ``temp > 40``.

Every result is emitted when the watermark makes it final (an event-time timer at the reading's
time fires once no reading at or before it can still arrive), so the active, the standby and a
restore emit the same rows whatever their micro-batch boundaries. This is why the seed's
windows become event-time windows here (see docs/plans.md, "deterministic outputs").
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from tandem.config import spark_interval
from tandem.plans import PlanContext, query

STREAM = "temps"
AVERAGE_WINDOW_MS = 2 * 60 * 1000
ALERT_WITHIN_MS = 10 * 60 * 1000
ALERT_RISE = 5.0

READING = StructType([StructField("time", LongType()), StructField("device_id", StringType()),
                      StructField("temp", DoubleType())])
PROGRESS = StructType([StructField("done_until", LongType())])
AVG_OUTPUT = StructType([
    StructField("room_no", LongType()), StructField("device_id", StringType()), StructField("temp", DoubleType()),
    StructField("time", LongType()), StructField("avg_temp", DoubleType()), StructField("readings", LongType()),
])
ALERT_OUTPUT = StructType([
    StructField("room_no", LongType()),
    StructField("initial_device_id", StringType()), StructField("initial_temp", DoubleType()),
    StructField("initial_time", LongType()),
    StructField("final_device_id", StringType()), StructField("final_temp", DoubleType()),
    StructField("final_time", LongType()),
])
ALERTED = StructType([*READING.fields])

Reading = tuple[int, str, float]  # (time ms, device id, temp)


# --- the semantics, as pure functions over one room's readings ------------------------------------------------


def averages_at(readings: list[Reading], times: list[int]) -> list[tuple[Reading, float, int]]:
    """For every reading at one of ``times``: the average and count of readings in ``(t − 2 min, t]``."""
    out = []
    for t in sorted(set(times)):
        window = [temp for time, _, temp in readings if t - AVERAGE_WINDOW_MS < time <= t]
        for reading in sorted(r for r in readings if r[0] == t):
            out.append((reading, sum(window) / len(window), len(window)))
    return out


def rises_at(readings: list[Reading], alerted: set[Reading], t: int) -> list[tuple[Reading, Reading]]:
    """Alerts ``(e1, e2)`` whose e2 is at time ``t``: e1 earlier by at most 10 min, not alerted yet, 5° colder.

    Called for each reading time in increasing order, this finds each e1's earliest e2 (ties at the
    same time broken by device id, then temperature).
    """
    at_t = sorted(r for r in readings if r[0] == t)
    out = []
    for e1 in sorted(readings):
        if e1 in alerted or not e1[0] < t <= e1[0] + ALERT_WITHIN_MS:
            continue
        rising = [e2 for e2 in at_t if e2[2] >= e1[2] + ALERT_RISE]
        if rising:
            out.append((e1, rising[0]))
    return out


# --- the stateful processors: keep a room's recent readings, act when the watermark passes a reading ----------


class _RoomProcessor(StatefulProcessor):
    """Readings of one room in a list state; a timer at every reading time; ``done_until`` = last time handled.

    The first timer of a room to fire in a micro-batch handles every reading up to the batch's
    watermark (all of them are final: a reading at or before the watermark can no longer arrive);
    the room's other timers of that batch then cost nothing. Every state call is a round trip
    between the Python worker and the JVM, so each one is made once.
    """

    keep_ms = 0

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.readings = handle.getListState("readings", READING)
        self.progress = handle.getValueState("progress", PROGRESS)
        self.handled_rooms: set[Any] = set()
        self.handled_watermark: int | None = None

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        done_until = self._done_until()
        for frame in rows:
            fresh = [(int(t), str(d), float(v)) for t, d, v in zip(frame["time"], frame["device_id"], frame["temp"])
                     if done_until is None or int(t) > done_until]
            if fresh:
                self.readings.appendList(fresh)
                for time in sorted({r[0] for r in fresh}):
                    self.handle.registerTimer(time)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        now = max(expiredTimerInfo.getExpiryTimeInMs(), timerValues.getCurrentWatermarkInMs())
        if self.handled_watermark != now:
            self.handled_rooms, self.handled_watermark = set(), now
        if key in self.handled_rooms:
            return
        self.handled_rooms.add(key)
        done_until = self._done_until()
        readings = [(int(t), str(d), float(v)) for t, d, v in self.readings.get()]
        times = sorted({r[0] for r in readings if r[0] <= now and (done_until is None or r[0] > done_until)})
        rows = self.emit(int(key[0]), readings, times)
        self.progress.update((now,))
        keep = [r for r in readings if r[0] > now - self.keep_ms]
        if len(keep) != len(readings):
            self.readings.put(keep) if keep else self.readings.clear()
        self.after(now)
        if rows:
            yield pd.DataFrame(rows, columns=[f.name for f in self.output.fields])

    def _done_until(self) -> int | None:
        stored = self.progress.get()
        return None if stored is None else int(stored[0])

    def emit(self, room: int, readings: list[Reading], times: list[int]) -> list[tuple]:
        raise NotImplementedError

    def after(self, now: int) -> None:
        pass

    def close(self) -> None:
        pass


class AverageProcessor(_RoomProcessor):
    output = AVG_OUTPUT
    keep_ms = AVERAGE_WINDOW_MS

    def emit(self, room: int, readings: list[Reading], times: list[int]) -> list[tuple]:
        return [(room, device, temp, time, avg, count) for (time, device, temp), avg, count in averages_at(readings, times)]


class RiseProcessor(_RoomProcessor):
    output = ALERT_OUTPUT
    keep_ms = ALERT_WITHIN_MS

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.alerted_state = handle.getListState("alerted", ALERTED)

    def emit(self, room: int, readings: list[Reading], times: list[int]) -> list[tuple]:
        alerted = {(int(t), str(d), float(v)) for t, d, v in self.alerted_state.get()}
        self.alerted_stored = frozenset(alerted)
        rows = []
        for time in times:
            for e1, e2 in rises_at(readings, alerted, time):
                alerted.add(e1)
                rows.append((room, e1[1], e1[2], e1[0], e2[1], e2[2], e2[0]))
        self.alerted = alerted
        return rows

    def after(self, now: int) -> None:
        keep = sorted(r for r in self.alerted if r[0] > now - ALERT_WITHIN_MS)
        if set(keep) != self.alerted_stored:
            self.alerted_state.put(keep) if keep else self.alerted_state.clear()


def _per_room(readings: DataFrame, processor: StatefulProcessor, output: StructType, watermark_s: float) -> DataFrame:
    timed = readings.withWatermark("event_time", spark_interval(watermark_s))
    result = timed.select("room_no", "device_id", "temp", "time", "event_time").groupBy("room_no") \
        .transformWithStateInPandas(statefulProcessor=processor, outputStructType=output, outputMode="Append",
                                    timeMode="EventTime")
    return result


def average_temperatures(readings: DataFrame, watermark_s: float) -> DataFrame:
    """``avg_temps``: each reading with its room's 2-minute average, once final."""
    return _per_room(readings, AverageProcessor(), AVG_OUTPUT, watermark_s)


def rising_temperatures(readings: DataFrame, watermark_s: float) -> DataFrame:
    """``temp_alerts``: each reading followed within 10 minutes by one at least 5° warmer, once final."""
    return _per_room(readings, RiseProcessor(), ALERT_OUTPUT, watermark_s)


def high_temperatures(readings: DataFrame) -> DataFrame:
    """``high_temps``: readings of rooms 100–109 above 40°."""
    return readings.where((F.col("room_no") >= 100) & (F.col("room_no") < 110) & (F.col("temp") > 40)) \
        .select("room_no", "device_id", "temp", "time")


@query("avg_temps")
def avg_temps(ctx: PlanContext) -> DataFrame:
    return average_temperatures(ctx.events(STREAM), ctx.plan.watermark_s)


@query("temp_alerts")
def temp_alerts(ctx: PlanContext) -> DataFrame:
    return rising_temperatures(ctx.events(STREAM), ctx.plan.watermark_s)


@query("high_temps")
def high_temps(ctx: PlanContext) -> DataFrame:
    return high_temperatures(ctx.events(STREAM))


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
        return {STREAM: out}


generator = TemperatureGenerator
