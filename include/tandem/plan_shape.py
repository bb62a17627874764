"""What an instance's checkpoint was built from, and how a change of the plan compares with it (issues 46 §1, 48 §0-1).

A checkpoint holds Spark's offsets and state for the partitions its instance read, in the shape the plan
had then. Tandem records that shape beside it (:data:`SHAPE_FILE`): the plan's version
(:mod:`tandem.plan_version`), its group's parallelism, every stream's partitions and fields, and the state each
output's kind declares (:meth:`tandem.outputs.base.OutputKind.state_shape`). A change of the plan is one of these
classes (:func:`changes`, pure):

- :data:`CODE`: the YAML or the module changed and nothing a checkpoint holds did (a relaunch takes it);
- :data:`STATE_COMPATIBLE`: a stream, an output or its state added or removed (new queries start their own
  checkpoints; removed ones are not read any more);
- :data:`STREAM_SCHEMA`: a stream's field added, removed, retyped or read from another key;
- :data:`STATE_REBUILD`: the state an output declares changed (an aggregation's keys or measures: Spark's state
  holds the old ones, ``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``, the serving table the old columns);
- :data:`TOPOLOGY`: a group's ``parallel`` or a stream's ``partitions`` (an instance would read partitions another
  one already counted: the retired one's files again, counted twice within the watermark).

Every launch compares the plan with the shapes recorded for its group and refuses the last two, before any query
starts, in one line that names the change (:func:`check_unchanged`); ``tandem plan diff`` shows every class
(:func:`pending_changes`). Reading and writing the records is the edge.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig
from tandem.declarations import FieldConfig
from tandem.errors import PlanChanged
from tandem.layout import checkpoint_dir
from tandem.outputs import kind_of
from tandem.plan_version import plan_version

SHAPE_FILE = "tandem-plan-shape.json"
"""Beside an instance's query checkpoints (``checkpoints/<plan>/<instance>/<node>/``)."""
FORMAT = 2
LEGACY_FORMAT = 1
"""Format 1 kept aggregations only, as ``aggregations`` (read as format 2's ``outputs`` of that kind)."""

Shape = dict[str, Any]

CODE = "code only"
STATE_COMPATIBLE = "state compatible"
STREAM_SCHEMA = "stream schema"
STATE_REBUILD = "state to rebuild"
TOPOLOGY = "topology"
CLASSES = (CODE, STATE_COMPATIBLE, STREAM_SCHEMA, STATE_REBUILD, TOPOLOGY)
"""The classes of a change, least to most demanding."""
REFUSED = frozenset({STATE_REBUILD, TOPOLOGY})
"""What a launch refuses: its checkpoints cannot carry it."""


@dataclass(frozen=True)
class Change:
    """One change of a plan since a checkpoint was built: its class (:data:`CLASSES`) and what it is, in words."""

    kind: str
    text: str

    @property
    def refused(self) -> bool:
        return self.kind in REFUSED


def shape_of(plan: PlanConfig, instance: str) -> Shape:
    """What an instance's checkpoint depends on: the plan's version, its group's parallelism, every stream's
    partitions and fields, and the state each output's kind declares."""
    group, _ = plan.group_of(instance)
    outputs = {}
    for output in plan.outputs:
        kind = kind_of(plan, output)
        state = kind.state_shape(plan, output)
        if state is not None:
            outputs[output] = {"kind": kind.name, **state}
    return {"format": FORMAT, "version": plan_version(plan), "group": group, "parallel": plan.groups[group].parallel,
            "partitions": {name: stream.partitions for name, stream in plan.streams.items()},
            "fields": {name: {field: _field_text(declared) for field, declared in stream.fields.items()}
                       for name, stream in plan.streams.items()},
            "outputs": outputs}


def _field_text(field: FieldConfig) -> str:
    text = field.type if field.source is None else f"{field.type} from {'.'.join(field.source)}"
    text = text if field.formerly is None else f"{text} formerly {'.'.join(field.formerly)}"
    return text if field.required_since is None else f"{text} required since {field.required_since.isoformat()}"


def changes(recorded: Shape, current: Shape) -> list[Change]:
    """Each change from ``recorded`` to ``current``, classified (pure; ``[]``: the same plan). A record of
    :data:`LEGACY_FORMAT` has no version and no fields: those are not compared."""
    found = []
    if recorded["parallel"] != current["parallel"]:
        found.append(Change(TOPOLOGY, f"group {current['group']}'s parallel changed from {recorded['parallel']} to "
                                      f"{current['parallel']} (its instances would read partitions another one "
                                      "already counted)"))
    for stream, before in sorted(recorded["partitions"].items()):
        after = current["partitions"].get(stream)
        if after is None:
            found.append(Change(STATE_COMPATIBLE, f"stream {stream} removed (not read any more)"))
        elif after != before:
            found.append(Change(TOPOLOGY, f"stream {stream}'s partitions changed from {before} to {after} (every key "
                                          "would move to another partition)"))
    for stream in sorted(set(current["partitions"]) - set(recorded["partitions"])):
        found.append(Change(STATE_COMPATIBLE, f"stream {stream} added"))
    for stream, before in sorted(recorded.get("fields", {}).items()):
        after = current["fields"].get(stream)
        if after is not None:
            found += _field_changes(stream, before, after)
    found += _output_changes(recorded["outputs"], current["outputs"])
    if not found and recorded.get("version") not in (None, current["version"]):
        found.append(Change(CODE, f"version {recorded['version']} to {current['version']}: the plan's YAML or module "
                                  "changed, nothing its checkpoints hold did"))
    return found


def _field_changes(stream: str, before: dict[str, str], after: dict[str, str]) -> list[Change]:
    found = [Change(STREAM_SCHEMA, f"stream {stream}: field {name} ({after[name]}) added")
             for name in after if name not in before]
    found += [Change(STREAM_SCHEMA, f"stream {stream}: field {name} ({before[name]}) removed")
              for name in before if name not in after]
    found += [Change(STREAM_SCHEMA, f"stream {stream}: field {name} from {before[name]} to {after[name]}")
              for name in after if name in before and before[name] != after[name]]
    return found


def _output_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    found = [Change(STATE_COMPATIBLE, f"{state['kind']} {output} added (its query starts its own checkpoint)")
             for output, state in sorted(current.items()) if output not in recorded]
    for output, before in sorted(recorded.items()):
        after = current.get(output)
        kind = before["kind"]
        if after is None:
            found.append(Change(STATE_COMPATIBLE, f"{kind} {output} removed (its state is not read any more)"))
            continue
        if after["kind"] != kind:
            found.append(Change(STATE_REBUILD, f"{kind} {output} became a {after['kind']} output"))
            continue
        if after["keys"] != before["keys"]:
            found.append(Change(STATE_REBUILD, f"{kind} {output}'s keys changed from "
                                               f"{', '.join(before['keys']) or '(none)'} to "
                                               f"{', '.join(after['keys']) or '(none)'}"))
        old, new = before["measures"], after["measures"]
        added = [m for m in new if m not in old]
        removed = [m for m in old if m not in new]
        changed = [f"{m} from {old[m]} to {new[m]}" for m in new if m in old and old[m] != new[m]]
        for what, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                found.append(Change(STATE_REBUILD, f"{kind} {output}: measure{'s' if len(names) > 1 else ''} "
                                                   f"{', '.join(names)} {what}"))
    return found


def refusal(plan: PlanConfig, instance: str, where: Path, found: list[Change]) -> str:
    """The one line a refused launch says (pure)."""
    group = plan.group_of(instance)[0]
    return (f"plan {plan.name}, instance {instance}: {'; '.join(c.text for c in found)} since the checkpoint at "
            f"{where} was built; its checkpoints cannot take this change: stop the plan and run `tandem plan cutover "
            f"{plan.name} --group {group}` (it keeps every output, see docs/plans/changing.md), or undo it in "
            f"{plan.path}; `tandem plan diff {plan.name}` shows every change")


STATE_SCHEMA_ERRORS = (
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE", "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
)
"""Spark's error conditions for a query whose state in its checkpoint another shape of the query wrote: a change of
the plan's code no declaration shows (a new ``dropDuplicates`` key, another window, a stateful operator added)."""


def state_refusal(plan: str, query: str, error: str) -> str | None:
    """The one line a query's failure says when Spark refused its checkpoint's state as of another shape (pure;
    ``None``: another failure). Spark's text (a stack trace) stays in the driver's log."""
    condition = next((c for c in STATE_SCHEMA_ERRORS if c in error), None)
    if condition is None:
        return None
    return (f"plan {plan}: query {query}'s state in its checkpoint was written by another version of the query "
            f"(Spark: {condition}); a running plan cannot take this change yet: undo it, or start the plan afresh "
            f"(stop it, then `tandem plan reset {plan}`); `tandem plan diff {plan}` shows the declared changes")


@dataclass(frozen=True)
class RecordedDiff:
    """How the plan now differs from what one instance's checkpoint on one node was built from."""

    instance: str
    node: str
    version: str | None
    """The version the checkpoint was built with (``None``: recorded before versions were)."""
    changes: list[Change]


def pending_changes(cluster: ClusterConfig, plan: PlanConfig) -> list[RecordedDiff]:
    """Per checkpoint of the plan (instance × node) that has a record, how the plan now differs from it."""
    root = checkpoint_dir(cluster, plan.name, plan.instances[0], plan.nodes[0]).parent.parent
    # the shape the plan now gives each group (its instances differ only in name), computed once: it hashes files
    current = {group: shape_of(plan, f"{group}-1") for group in plan.groups}
    found = []
    for record in sorted(root.glob(f"*/*/{SHAPE_FILE}")):
        recorded = _read(record)
        if recorded is None:
            continue
        now = current.get(recorded.get("group", ""))
        diff = ([Change(TOPOLOGY, f"group {recorded.get('group')} removed")] if now is None
                else changes(recorded, now))
        found.append(RecordedDiff(instance=record.parent.parent.name, node=record.parent.name,
                                  version=recorded.get("version"), changes=diff))
    return found


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
        found = [change for change in changes(recorded, current) if change.refused]
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
