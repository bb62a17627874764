"""Plans: the queries of each streaming application, as pure DataFrame functions.

A plan module (``conf/plans/<name>.yaml`` → ``module``) exposes ``build(ctx) -> list[QueryDefinition]``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from pyspark.sql import DataFrame, SparkSession

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import PlanError
from tandem.runtime.publisher import Sink
from tandem.store.registry import InstanceKey


@dataclass(frozen=True)
class PlanContext:
    """What a plan needs to build its queries for one instance."""

    cluster: ClusterConfig
    plan: PlanConfig
    instance: InstanceKey
    spark: SparkSession


@dataclass(frozen=True)
class QueryDefinition:
    """One streaming query of a plan: a streaming DataFrame and where its batches go."""

    name: str
    frame: DataFrame
    output_mode: str
    sink: Sink
    state_value_names: tuple[str, ...] = ()
    """Names of the fields of the query's state values, in order (Spark names them after the
    aggregate functions: ``sum``, ``count``, ...); used by snapshot exports."""


def load_plan_module(plan: PlanConfig) -> ModuleType:
    try:
        module = importlib.import_module(plan.module)
    except ImportError as exc:
        raise PlanError(f"{plan.path}: module: cannot import {plan.module!r}: {exc}") from exc
    if not callable(getattr(module, "build", None)):
        raise PlanError(f"{plan.path}: module: {plan.module!r} has no build(ctx) function")
    return module
