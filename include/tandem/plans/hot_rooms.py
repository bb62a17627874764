"""hot_rooms: the queries of conf/plans/hot_rooms.yaml, two stages linked by the NATS stream ``hot``.

- ``hot_readings`` (stage 1, group ``readings``): every reading of ``temps`` at or above
  :data:`HOT_AT_LEAST` degrees, as an event (published to PostgreSQL, Delta and the stream ``hot``).
- ``room_facts`` (stage 2, group ``rooms``): every event of ``hot`` as a fact of ``room_stats``, the
  per-room minute count and maximum of hot readings (the sink adds each fact once, by its fields).

Sample readings (``tandem produce hot_rooms``) are the temperature plan's: rooms that drift, jump and run hot.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from tandem.plans import PlanContext, query
from tandem.plans.temperatures import TemperatureGenerator

HOT_AT_LEAST = 30.0
FIELDS = ["room_no", "device_id", "temp", "time"]


@query("hot_readings")
def hot_readings(ctx: PlanContext) -> DataFrame:
    """The readings at or above :data:`HOT_AT_LEAST`."""
    return ctx.events("temps").where(f"temp >= {HOT_AT_LEAST}").select(*FIELDS)


@query("room_stats")
def room_facts(ctx: PlanContext) -> DataFrame:
    """Each hot reading stage 1 published, as a fact of the room's statistics."""
    return ctx.events("hot").select(*FIELDS)


generator = TemperatureGenerator
