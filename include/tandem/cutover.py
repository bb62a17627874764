"""Carry out a change a launch refuses, by a cut-over of a group (issue 48 §2-3: rescale, state to rebuild).

A group's parallelism, or the state its queries keep (an aggregation's keys or measures), cannot change under its
checkpoints (:mod:`tandem.plan_shape`). A cut-over of the stopped group makes the change safe:

1. **The cut.** Per query, the input files the group's instances read (their authoritative checkpoints: the
   last lease holder's) and the newest event-time watermark they committed. Recorded in :func:`~tandem.layout.
   cut_file` before anything changes, so that a cut-over that stops half-way is finished by running it again.
2. **Partials retired.** Rows a kind publishes as Spark's partials (not by id) are kept under retired labels
   (``shard-1~2``: instance ``shard-1`` before cut 2), in PostgreSQL and Delta: merged on read with the new
   instances' partials, each event counted by the instance that read it, before the cut or after it.
3. **Checkpoints retired.** Every checkpoint of the group (every node) moves to ``checkpoints/<plan>/_retired/``;
   the instances' recorded failures are cleared.

The group's next launch (with the new parallelism, or the new declarations) starts fresh checkpoints; each query
reads past the cut only (:class:`Cut.lines_filter`): a query that writes partials skips every file the group read
before the cut; a query whose outputs are all published by id replays the events of those files from the state
horizon on (the plan's ``state_horizon`` before the cut's watermark), which rebuilds its windows, expiries and
timers, and republishes only ids already published. What stays refused: a stream's number of partitions, a group
that reads a ``nats`` stream, restores of snapshots taken before a cut, and backfills of ranges that start before
the event time the retired partials reach (:attr:`Cut.reach_ms`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tandem.checkpoints import (
    committed_batch, committed_watermark_ms, newest_log_entry, processed_files_by_source, query_dirs,
)
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import TandemError
from tandem.layout import checkpoint_dir, cut_file, retired_checkpoints_dir
from tandem.outputs import kind_of
from tandem.plan_reset import running_message, while_stopped
from tandem.plan_shape import pending_changes
from tandem.store.db import Database
from tandem.store.leases import read_lease
from tandem.store.publish_log import last_publisher, published_batch
from tandem.store.registry import InstanceKey, clear_failures

RETIRED_MARK = "~"
"""Between an instance's id and its cut's generation in a retired label (``shard-1~2``): not a character of an
instance id."""


class CutoverRefused(TandemError):
    """A cut-over that cannot be carried out (what runs, what it cannot do), before it changes anything."""


@dataclass(frozen=True)
class Cut:
    """A group's cut-over: what its retired instances had read, per query."""

    plan: str
    group: str
    generation: int
    at: float
    """When the cut-over began (POSIX time): ranges of event time before it are the retired instances'."""
    retired: tuple[str, ...]
    """The instances whose checkpoints and partials were retired."""
    watermark_ms: int
    """The least event-time watermark the retired queries committed (epoch milliseconds)."""
    horizon_start_ms: int
    """Events of the files read before the cut from this event time on are replayed to queries published by id."""
    consumed: dict[str, frozenset[str]] = field(default_factory=dict)
    """Per query, the files (``file:`` URIs, as Spark logs them) the retired instances read."""
    done: bool = False
    earlier: tuple[str, ...] = ()
    """The labels the group's earlier cut-overs retired (their partials are still merged on read)."""
    reach_ms: int | None = None
    """The event time (epoch milliseconds) before which every event the retired partials of this cut and the earlier
    ones counted lies (:meth:`tandem.outputs.base.OutputKind.counted_until`); ``None``: they hold none. A cut recorded
    before this was kept has its wall-clock ``at`` instead."""

    @property
    def labels(self) -> tuple[str, ...]:
        """Every retired label of the group: the earlier cuts', then this one's."""
        return (*self.earlier, *(self.label(instance) for instance in self.retired))

    def label(self, instance: str) -> str:
        """The label a retired instance's partials carry after this cut."""
        return f"{instance}{RETIRED_MARK}{self.generation}"

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "group": self.group, "generation": self.generation, "at": self.at,
                "retired": list(self.retired), "watermark_ms": self.watermark_ms,
                "horizon_start_ms": self.horizon_start_ms, "done": self.done, "earlier": list(self.earlier),
                "reach_ms": self.reach_ms,
                "consumed": {query: sorted(files) for query, files in self.consumed.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cut:
        return cls(plan=data["plan"], group=data["group"], generation=int(data["generation"]), at=float(data["at"]),
                   retired=tuple(data["retired"]), watermark_ms=int(data["watermark_ms"]),
                   horizon_start_ms=int(data["horizon_start_ms"]), done=bool(data["done"]),
                   earlier=tuple(data.get("earlier", ())),
                   reach_ms=data["reach_ms"] if "reach_ms" in data else int(float(data["at"]) * 1000),
                   consumed={query: frozenset(files) for query, files in data["consumed"].items()})


def load_cut(cluster: ClusterConfig, plan: str, group: str) -> Cut | None:
    """The group's newest cut-over, or ``None``."""
    path = cut_file(cluster, plan, group)
    try:
        return Cut.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise TandemError(f"{path}: not a cut-over record ({exc}): restore it from a backup; without it the group's "
                          "instances would read again what they had read before the cut") from None


def _write_cut(cluster: ClusterConfig, cut: Cut) -> None:
    path = cut_file(cluster, cut.plan, cut.group)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(cut.to_json()) + "\n")
    os.replace(partial, path)


def retired_labels(cluster: ClusterConfig, plan: PlanConfig) -> list[str]:
    """Every label a cut-over of the plan's groups gave its retired instances' rows (validation takes them as the
    plan's instances: they published before their cut)."""
    return [label for group in plan.groups if (cut := load_cut(cluster, plan.name, group)) for label in cut.labels]


def refusal_before_cut(cluster: ClusterConfig, plan: PlanConfig, taken_at: float, what: str) -> str | None:
    """Why ``what``, a snapshot taken at ``taken_at`` (POSIX time), cannot be restored after a cut-over that began
    later, or ``None``."""
    cuts = [cut for group in plan.groups if (cut := load_cut(cluster, plan.name, group)) and cut.at > taken_at]
    if not cuts:
        return None
    cut = max(cuts, key=lambda c: c.at)
    return (f"{what} reaches before the cut-over of group {cut.group} (generation {cut.generation}, "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(cut.at))}): its rows are the retired instances' "
            f"({', '.join(cut.retired)}), which a recomputation by today's instances would count again")


def range_refusal_before_cut(cluster: ClusterConfig, plan: PlanConfig, start: datetime) -> str | None:
    """Why a recomputation of event time from ``start`` on (a backfill) would count again events the retired
    instances of a cut-over counted (its range starts before their :attr:`Cut.reach_ms`), or ``None``."""
    start_ms = int(start.timestamp() * 1000)
    cuts = [cut for group in plan.groups if (cut := load_cut(cluster, plan.name, group))
            and cut.reach_ms is not None and start_ms < cut.reach_ms]
    if not cuts:
        return None
    cut = max(cuts, key=lambda c: c.reach_ms)
    reach = datetime.fromtimestamp(cut.reach_ms / 1000, timezone.utc).isoformat()
    return (f"the range from {start.isoformat()} reaches before {reach}, where the partials the cut-over of group "
            f"{cut.group} (generation {cut.generation}) retired end ({', '.join(cut.labels)}): a recomputation by "
            f"today's instances would count their events again; start it at or after {reach}")


# --- what a cut-over does --------------------------------------------------------------------------------------


def pending_cutovers(cluster: ClusterConfig, plan: PlanConfig) -> dict[str, list[str]]:
    """Per group whose checkpoints cannot carry the plan as it is now, the refused changes (in words)."""
    pending: dict[str, list[str]] = {}
    for diff in pending_changes(cluster, plan):
        group = diff.instance.rpartition("-")[0]
        for change in diff.changes:
            if group in plan.groups and change.refused and change.text not in pending.get(group, []):
                pending.setdefault(group, []).append(change.text)
    return pending


def _why_not(plan: PlanConfig, group: str, refused: list[str]) -> str | None:
    """Why a cut-over of ``group`` cannot carry the plan's change (pure), or ``None``."""
    partitions = [text for text in refused if "partitions changed" in text]
    if partitions:
        return (f"{'; '.join(partitions)}: a cut-over keeps each key in its partition; repartition the stream's "
                "input into a new stream, then change the plan to read it")
    keys = [text for text in refused if "keys changed" in text or " became a " in text]
    if keys:
        return (f"{'; '.join(keys)}: the rows published before the cut have the old keys and could not be merged "
                "with the new ones; declare a new output instead (the old one can be removed)")
    nats = [name for name, stream in plan.streams.items() if stream.source != "files"]
    if nats:
        return (f"the plan reads {', '.join(nats)} over NATS: a cut-over of its consumers is not supported yet "
                "(the cut is the files each instance read)")
    return None


def _authoritative_node(db: Database, cluster: ClusterConfig, plan: PlanConfig, instance: str) -> str | None:
    """The node whose checkpoint of ``instance`` holds what was published: the one that published last (a hot
    standby may have read further, holding outputs it never published), else the last lease holder, else the node
    whose checkpoint committed the most batches (nothing published yet)."""
    publisher = last_publisher(db, plan.name, instance)
    if publisher is not None:
        return publisher
    lease = read_lease(db, plan.name, instance)
    if lease is not None and lease.holder is not None:
        return lease.holder
    batches = {}
    for node in plan.nodes:
        root = checkpoint_dir(cluster, plan.name, instance, node)
        committed = [committed_batch(q) for q in query_dirs(root).values()]
        batches[node] = max((b for b in committed if b is not None), default=-1)
    best = max(batches, key=batches.get, default=None)
    return best if best is not None and batches[best] >= 0 else None


def _cut_batch(db: Database, plan: PlanConfig, instance: str, node: str, query: str, query_dir,
               partial_outputs: list[str]) -> int | None:
    """The batch whose files a query's cut holds: its last committed one, or a batch it planned and did not commit
    (a stop interrupts a batch) when it published that batch's partials (they counted its files). A query published
    by id re-reads an uncommitted batch's files whole after the cut: what it publishes again has ids published."""
    committed, planned = committed_batch(query_dir), newest_log_entry(query_dir / "offsets")
    if planned is not None and planned != committed and partial_outputs and \
            published_batch(db, InstanceKey(plan.name, instance, node), partial_outputs, planned):
        return planned
    return committed


def _new_cut(db: Database, cluster: ClusterConfig, plan: PlanConfig, group: str, retired: list[str],
             generation: int, earlier: tuple[str, ...], partial_outputs: dict[str, list[str]],
             reach_before: int | None) -> Cut:
    consumed: dict[str, set[str]] = {}
    watermarks = []
    for instance in retired:
        node = _authoritative_node(db, cluster, plan, instance)
        if node is None:
            continue
        for query, query_dir in query_dirs(checkpoint_dir(cluster, plan.name, instance, node)).items():
            for files in processed_files_by_source(query_dir, _cut_batch(db, plan, instance, node, query, query_dir,
                                                                          partial_outputs.get(query, []))):
                consumed.setdefault(query, set()).update(files or ())
            watermark = committed_watermark_ms(query_dir)
            if watermark is not None:
                watermarks.append(watermark)
    watermark_ms = min(watermarks, default=0)
    reached = [int(until.timestamp() * 1000) for output, config in plan.outputs.items()
               if not (kind := kind_of(plan, output)).published_by_id(config)
               and (until := kind.counted_until(db, plan, output, retired)) is not None]
    return Cut(plan=plan.name, group=group, generation=generation, at=time.time(), retired=tuple(retired),
               watermark_ms=watermark_ms, horizon_start_ms=watermark_ms - int(plan.state_horizon_s * 1000),
               consumed={query: frozenset(files) for query, files in consumed.items()}, earlier=earlier,
               reach_ms=max([*reached, *([reach_before] if reach_before is not None else [])], default=None))


def cut_over(cluster: ClusterConfig, plan: PlanConfig, db: Database, group: str | None = None,
             *, partial_outputs: dict[str, list[str]] | None = None, force: bool = False) -> Cut:
    """Cut a stopped group over to the plan as it is now (see the module's docs); the cut.

    Everything it does runs while the plan is kept still (:func:`tandem.plan_reset.while_stopped`: the plan's lock,
    which restores, backfills, retention and Delta upkeep take too, every instance's supervision lock and every
    node's launch lock), and what runs is checked under them.

    Args:
        group: the group to cut over (default: the one whose checkpoints refuse the plan).
        partial_outputs: per query, the outputs it publishes as Spark's partials
            (:func:`tandem.runtime.plan_api.partial_outputs_by_query`): a batch a stop interrupted after they were
            published belongs to the cut.
        force: cut over a group whose checkpoints carry the plan as it is (nothing refused): it only restarts the
            group's instances past a cut.

    Raises:
        CutoverRefused: nothing to cut over, the group runs, or the change is one a cut-over cannot carry.
    """
    with while_stopped(cluster, plan, db, "a cut-over",
                       lambda reasons: CutoverRefused(running_message(plan, reasons, "cut over"))):
        return _cut_over(cluster, plan, db, group, partial_outputs or {}, force)


def _cut_over(cluster: ClusterConfig, plan: PlanConfig, db: Database, group: str | None,
              partial_outputs: dict[str, list[str]], force: bool) -> Cut:
    unfinished = [c for c in (load_cut(cluster, plan.name, g) for g in plan.groups) if c is not None and not c.done]
    pending = pending_cutovers(cluster, plan)
    if group is None:
        candidates = sorted({*pending, *(c.group for c in unfinished)})
        if len(candidates) != 1:
            raise CutoverRefused(f"plan {plan.name}: " + (
                "no group's checkpoints refuse the plan as it is: nothing to cut over" if not candidates else
                f"the groups {', '.join(candidates)} all need a cut-over: name one (--group)"))
        group = candidates[0]
    if group not in plan.groups:
        raise CutoverRefused(f"plan {plan.name} has no group {group!r} (groups: {', '.join(plan.groups)})")
    if group not in pending and group not in {c.group for c in unfinished} and not force:
        raise CutoverRefused(f"plan {plan.name}, group {group}: its checkpoints carry the plan as it is: nothing to "
                             "cut over (--force cuts it over anyway: its instances restart afresh past a cut)")
    why = _why_not(plan, group, pending.get(group, []))
    if why is not None:
        raise CutoverRefused(f"plan {plan.name}, group {group}: {why}")
    previous = load_cut(cluster, plan.name, group)
    root = checkpoint_dir(cluster, plan.name, plan.instances[0], plan.nodes[0]).parent.parent
    if previous is not None and not previous.done:
        cut = previous  # a cut-over that stopped half-way: finish it with its own cut
    else:
        retired = sorted(p.name for p in root.glob(f"{group}-*") if p.is_dir() and p.name.rpartition("-")[0] == group)
        if not retired:
            raise CutoverRefused(f"plan {plan.name}, group {group}: no checkpoint to cut over")
        cut = _new_cut(db, cluster, plan, group, retired, (previous.generation + 1) if previous else 1,
                       previous.labels if previous else (), partial_outputs, previous.reach_ms if previous else None)
        _write_cut(cluster, cut)
    for output, config in plan.outputs.items():
        kind = kind_of(plan, output)
        if not kind.published_by_id(config):
            kind.retire(db, cluster, plan, output, {instance: cut.label(instance) for instance in cut.retired})
    target = retired_checkpoints_dir(cluster, plan.name, cut.generation)
    for instance in cut.retired:
        source = root / instance
        if source.exists():
            target.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(target / instance))
    for instance in {*cut.retired, *plan.instances}:
        if instance.rpartition("-")[0] == group:
            for node in plan.nodes:
                clear_failures(db, InstanceKey(plan.name, instance, node))
    done = Cut(**{**cut.__dict__, "done": True})
    _write_cut(cluster, done)
    return done
