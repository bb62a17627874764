"""The engine anchor: a plan's own queries with nothing published, in Spark's best configuration found here.

Tandem's benchmarks compare it with a hand-written job that has the same sinks, so both are slow together when the
sinks are. The anchor measures what the engine itself does with the plan's work on this machine: the instance's
queries exactly as the runtime builds them (the plan module's functions, parsing and validation included), each
micro-batch only materialised in the driver (``toArrow()``, as every Tandem sink does first), under a few
configurations of the state store, its checkpointing and the batch sizing. Its best is the ceiling a Tandem run can
approach; ``engine_ratio`` = Tandem ÷ engine-best.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


@dataclass(frozen=True)
class EngineConfig:
    """One configuration of the anchor."""

    name: str
    state_store: str
    """``default`` (Spark's HDFS-backed store) or ``rocksdb``; a ``transformWithState`` query keeps RocksDB."""
    changelog: bool
    """RocksDB changelog checkpointing: each batch uploads its changes, a snapshot only every few batches."""
    one_batch: bool
    """All the input in one micro-batch (catch-up), instead of the plan's ``max_files_per_trigger``."""


CONFIGS = (
    EngineConfig("default store, plan's batch size", "default", False, False),
    EngineConfig("RocksDB + changelog, plan's batch size", "rocksdb", True, False),
    EngineConfig("default store, one batch", "default", False, True),
    EngineConfig("RocksDB + changelog, one batch", "rocksdb", True, True),
)


def materialise(frame, batch_id: int) -> None:
    """The anchor's sink: the batch computed and brought to the driver, then dropped."""
    frame.toArrow()


def run_engine(cluster, plan, spark, config: EngineConfig, checkpoints: Path) -> float:
    """Every instance of ``plan`` (its group's queries, the quarantine included) to the end of its input
    (available-now) into :func:`materialise`; returns the wall seconds."""
    from tandem.batch.backfill import in_one_batch
    from tandem.runtime.node import start_query
    from tandem.runtime.plan_api import PlanContext, instance_queries, uses_transform_with_state
    from tandem.store.registry import InstanceKey

    class EngineContext(PlanContext):
        def sink(self, output: str):
            return materialise

        def routed(self, column: str, outputs):
            return materialise

    if config.one_batch:
        plan = in_one_batch(plan)
    shutil.rmtree(checkpoints, ignore_errors=True)
    previous = spark.conf.get(CHANGELOG, "false")
    spark.conf.set(CHANGELOG, str(config.changelog).lower())
    started = time.perf_counter()
    try:
        for instance in plan.instances:
            ctx = EngineContext(cluster, plan, InstanceKey(plan.name, instance, "engine"), spark)
            queries = []
            for definition in instance_queries(ctx):
                if not uses_transform_with_state(definition.frame):
                    definition = dataclasses.replace(definition, state_store=config.state_store)
                writer = (definition.frame.writeStream.outputMode(definition.output_mode)
                          .option("checkpointLocation", str(checkpoints / instance / definition.name))
                          .foreachBatch(materialise).trigger(availableNow=True))
                queries.append(start_query(spark, definition, writer))
            for query in queries:
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(f"engine anchor {plan.name}/{instance} ({config.name}): {query.exception()}")
        return time.perf_counter() - started
    finally:
        spark.conf.set(CHANGELOG, previous)
        shutil.rmtree(checkpoints, ignore_errors=True)


def summary(events: int, seconds: dict[str, list[float]], tandem_events_per_s: float) -> dict:
    """Per configuration: its runs and events/s (of the median run); the best, and Tandem ÷ the best."""
    import statistics

    rates = {name: events / statistics.median(runs) for name, runs in seconds.items() if runs}
    best = max(rates, key=rates.get)
    return {"configs": {name: {"seconds": seconds[name], "events_per_s": round(rate)} for name, rate in rates.items()},
            "best": best, "best_events_per_s": round(rates[best]),
            "engine_ratio": round(tandem_events_per_s / rates[best], 3), "target_engine_ratio": 0.9}


def ceiling(engine_runs: list[dict], tandem_runs: list[dict], cores: int) -> dict:
    """How close to the engine Tandem can get on ``cores`` while its PostgreSQL does what it does today.

    A Tandem run does at least the engine's work (the best configuration's CPU seconds, Python and JVM) and its
    publishing's PostgreSQL work (what PostgreSQL used in Tandem's timed runs). Overlapped perfectly, with nothing
    else added, that takes at least ``(engine CPU + PostgreSQL CPU) / cores`` and never less than the engine's own
    wall: the engine's wall over that is the highest ``engine_ratio`` reachable (pure; the median run of each).
    """
    import statistics

    engine_wall = statistics.median(r["wall_s"] for r in engine_runs)
    engine_cpu = statistics.median(r["cpu_s"]["benchmark"] for r in engine_runs)
    postgresql = statistics.median(r["cpu_s"]["postgresql"] for r in tandem_runs)
    least_wall = max(engine_wall, (engine_cpu + postgresql) / cores)
    return {"cores": cores, "engine_wall_s": engine_wall, "engine_cpu_s": engine_cpu,
            "engine_cores_busy": round(engine_cpu / engine_wall, 2),
            "tandem_postgresql_cpu_s": postgresql,
            "tandem_cpu_s": statistics.median(r["cpu_s"]["benchmark"] for r in tandem_runs),
            "least_tandem_wall_s": round(least_wall, 1), "engine_ratio_ceiling": round(engine_wall / least_wall, 3)}
