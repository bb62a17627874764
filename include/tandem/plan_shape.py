"""What an instance's checkpoint was built from, and the changes of a plan a launch refuses (issue 46 §1).

A checkpoint holds Spark's offsets and state for the partitions its instance read, in the shape the plan
had then. Two changes break it without a word from Spark, or with a raw one:

- a group's ``parallel`` or a stream's ``partitions``: the instance would read partitions another
  instance already counted (the retired one's files are read again; the watermark drops most of them
  and counts the rest twice);
- the state an output kind declares (:meth:`tandem.outputs.base.OutputKind.state_shape`: an aggregation's keys
  and measures): Spark's state holds the old measures (``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``), the
  serving table the old columns.

Until changing a running plan is a feature, every launch compares the plan with the shape recorded beside
each of its group's checkpoints (:data:`SHAPE_FILE`) and refuses, before any query starts, in one line that
names the change. The comparison is pure (:func:`changes`); reading and writing the records is the edge.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import PlanChanged
from tandem.layout import checkpoint_dir
from tandem.outputs import kind_of

SHAPE_FILE = "tandem-plan-shape.json"
"""Beside an instance's query checkpoints (``checkpoints/<plan>/<instance>/<node>/``)."""
FORMAT = 2
LEGACY_FORMAT = 1
"""Format 1 kept aggregations only, as ``aggregations`` (read as format 2's ``outputs`` of that kind)."""

Shape = dict[str, Any]


def shape_of(plan: PlanConfig, instance: str) -> Shape:
    """What an instance's checkpoint depends on: its group's parallelism, every stream's partitions, and the state
    each output's kind declares (pure)."""
    group, _ = plan.group_of(instance)
    outputs = {}
    for output in plan.outputs:
        kind = kind_of(plan, output)
        state = kind.state_shape(plan, output)
        if state is not None:
            outputs[output] = {"kind": kind.name, **state}
    return {"format": FORMAT, "group": group, "parallel": plan.groups[group].parallel,
            "partitions": {name: stream.partitions for name, stream in plan.streams.items()}, "outputs": outputs}


def changes(recorded: Shape, current: Shape) -> list[str]:
    """Each change from ``recorded`` to ``current`` that a checkpoint built as ``recorded`` cannot carry, in words
    (pure; ``[]``: none). A stream or output added is no such change; one removed is not read any more."""
    found = []
    if recorded["parallel"] != current["parallel"]:
        found.append(f"group {current['group']}'s parallel changed from {recorded['parallel']} to "
                     f"{current['parallel']} (its instances would read partitions another one already counted)")
    for stream, before in sorted(recorded["partitions"].items()):
        after = current["partitions"].get(stream)
        if after is not None and after != before:
            found.append(f"stream {stream}'s partitions changed from {before} to {after} (every key would move "
                         "to another partition)")
    for output, before in sorted(recorded["outputs"].items()):
        after = current["outputs"].get(output)
        if after is None:
            continue
        kind = before["kind"]
        if after["kind"] != kind:
            found.append(f"{kind} {output} became a {after['kind']} output")
            continue
        if after["keys"] != before["keys"]:
            found.append(f"{kind} {output}'s keys changed from {', '.join(before['keys']) or '(none)'} to "
                         f"{', '.join(after['keys']) or '(none)'}")
        old, new = before["measures"], after["measures"]
        added = [m for m in new if m not in old]
        removed = [m for m in old if m not in new]
        changed = [f"{m} from {old[m]} to {new[m]}" for m in new if m in old and old[m] != new[m]]
        for what, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                found.append(f"{kind} {output}: measure{'s' if len(names) > 1 else ''} {', '.join(names)} "
                             f"{what}")
    return found


def refusal(plan: PlanConfig, instance: str, where: Path, found: list[str]) -> str:
    """The one line a refused launch says (pure)."""
    return (f"plan {plan.name}, instance {instance}: {'; '.join(found)} since the checkpoint at {where} was built; "
            f"a running plan cannot take this change yet: undo it in {plan.path}, or start the plan afresh "
            f"(stop it, then `tandem plan reset {plan.name}` removes its checkpoints and outputs)")


def check_unchanged(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str) -> None:
    """Refuse (:class:`tandem.errors.PlanChanged`) when the plan changed in a way a checkpoint of the instance's
    group cannot carry: the instance's own on any node, and its siblings' (a new instance of a group whose
    parallelism changed reads partitions they counted)."""
    current = shape_of(plan, instance)
    group = current["group"]
    root = checkpoint_dir(cluster, plan.name, instance, node).parent.parent  # checkpoints/<plan>/
    for record in sorted(root.glob(f"{group}-*/*/{SHAPE_FILE}")):
        recorded = _read(record)
        if recorded is None or recorded.get("group") != group:
            continue
        found = changes(recorded, current)
        if found:
            raise PlanChanged(refusal(plan, instance, record.parent, found))


def refused_launches(cluster: ClusterConfig, plan: PlanConfig) -> list[str]:
    """What :func:`check_unchanged` would say at the launch of each of the plan's instances (``tandem config
    check``); ``[]``: every launch may go on."""
    found = []
    for instance in plan.instances:
        try:
            check_unchanged(cluster, plan, instance, plan.nodes[0])
        except PlanChanged as exc:
            found.append(str(exc))
    return found


def record_shape(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str) -> Path:
    """Write the plan's shape beside the instance's checkpoints on ``node`` (atomically); its path."""
    folder = checkpoint_dir(cluster, plan.name, instance, node)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / SHAPE_FILE
    partial = folder / f".{SHAPE_FILE}.partial"
    partial.write_text(json.dumps(shape_of(plan, instance), indent=1, sort_keys=True) + "\n")
    os.replace(partial, target)
    return target


def _read(path: Path) -> Shape | None:
    """A recorded shape (one of :data:`LEGACY_FORMAT` read as this format); ``None`` for one of another format (or
    unreadable: it is written again at the launch)."""
    try:
        shape = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(shape, dict):
        return None
    if shape.get("format") == LEGACY_FORMAT:
        legacy = shape.pop("aggregations", {})
        shape.update(format=FORMAT, outputs={name: {"kind": "aggregation", **state} for name, state in legacy.items()})
    return shape if shape.get("format") == FORMAT else None
