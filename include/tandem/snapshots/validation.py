"""Is a snapshot good? Its checkpoint cut must be restartable and its exported state must pass the plan's suite.

Purpose
    A snapshot is only worth keeping (and pruning older ones for) when a restore from it would
    work and its state export tells the truth. The snapshot DAG marks each snapshot GOOD or BAD
    from :func:`validate_snapshot`; ``tandem restore`` re-checks the files with
    :func:`check_files` before it relies on a snapshot.

How it works
    Two parts, both recorded in the catalog's ``validation`` column:

    - files: every query's cut has ``commits/N``, ``offsets/N``, an unbroken source log and a
      loadable state chain for version N+1 in every partition
      (:func:`tandem.checkpoints.verify_cut`, the check a cut passes when it is made). A
      state file deleted or lost afterwards fails here.
    - state: the exported rows of the snapshot (read back from ``state_snapshots``) are validated
      with the plan's Great Expectations suite (``conf/expectations/<snapshot.suite>.json``; a plan
      without one: :func:`tandem.quality.implied.implied_state_suite`, what holds for every plan), with
      the JSON key and value flattened into columns ``key.<field>`` / ``value.<field>`` and, per
      row, the batch the catalog says the query was cut at (``cut_batch_id``) and the newest batch
      Spark's state metadata lists for the operator (``metadata_max_batch_id``). The suite's
      parameters: ``expected_state_rows`` (Spark's own count of state rows after the cut's batch,
      ``numRowsTotal``) and ``max_partition_id``.

What it does not do
    It does not change the catalog (the caller marks the snapshot) and does not read live
    checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from tandem.checkpoints import CheckpointError, source_offsets, verify_cut
from tandem.config import ClusterConfig, PlanConfig
from tandem.quality.implied import MAX_PARTITION_PARAMETER, STATE_ROWS_PARAMETER, implied_state_suite
from tandem.quality.suites import ExpectationOutcome, plan_suite, run_suite
from tandem.snapshots.state_export import StateOperator
from tandem.sources import SOURCE_KINDS


@dataclass(frozen=True)
class SnapshotValidation:
    """The verdict on one snapshot: file problems and the suite's outcomes."""

    snapshot_id: str
    success: bool
    file_problems: list[str] = field(default_factory=list)
    outcomes: list[ExpectationOutcome] = field(default_factory=list)
    suite: str | None = None
    rows: int | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """Why the snapshot is bad ('' when it is good): the first problems, for the catalog and logs."""
        problems = [f"files: {p}" for p in self.file_problems]
        for outcome in self.outcomes:
            if not outcome.success:
                detail = (f"raised {outcome.exception}" if outcome.exception else
                          f"{outcome.unexpected_count} of {outcome.element_count} rows unexpected"
                          if outcome.unexpected_count is not None else "failed")
                problems.append(f"{self.suite}: {outcome.label}: {detail}")
        return "; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")

    def summary(self) -> str:
        verdict = "GOOD" if self.success else f"BAD: {self.reason}"
        passed = sum(o.success for o in self.outcomes)
        return (f"snapshot {self.snapshot_id}: {verdict} (files {'ok' if not self.file_problems else 'broken'}; "
                f"{self.suite or 'no suite'}: {passed}/{len(self.outcomes)} expectations on {self.rows} state rows)")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


def check_files(snapshot_dir: Path, query_batches: Mapping[str, int]) -> list[str]:
    """Problems with the snapshot's checkpoint cuts (empty when every query's cut is restartable)."""
    if not snapshot_dir.is_dir():
        return [f"{snapshot_dir} is missing"]
    if not query_batches:
        return ["the catalog lists no query cut"]
    problems = []
    for query, batch in sorted(query_batches.items()):
        try:
            verify_cut(snapshot_dir / query, batch)
        except CheckpointError as exc:
            problems.append(f"{query}: {exc}")
    return problems


def lost_input(cluster: ClusterConfig, snapshot_dir: Path, query_batches: Mapping[str, int]) -> list[str]:
    """What the snapshot's cuts would read next that their sources no longer hold (``[]``: nothing), as each source
    kind finds it (:meth:`tandem.sources.base.SourceKind.lost_input`: a ``nats`` stream whose retention dropped
    messages after a cut's offset, named with the missing range)."""
    offsets = []
    for query, batch in sorted(query_batches.items()):
        entry = snapshot_dir / query / "offsets" / str(batch)
        if entry.is_file():
            offsets += source_offsets(entry)
    return [lost for kind in SOURCE_KINDS.values() for lost in kind.lost_input(cluster, offsets)]


def state_frame(rows: pa.Table, fields: pa.Table, query_batches: Mapping[str, int],
                operators: Mapping[str, Sequence[StateOperator]]) -> pd.DataFrame:
    """The exported state rows with their key/value leaves (``fields``, row for row) and the cut's and
    the metadata's batch per row: the DataFrame the suite validates."""
    frame = pd.concat([rows.to_pandas(), fields.to_pandas()], axis=1) if fields.num_columns else rows.to_pandas()
    frame["cut_batch_id"] = frame["query"].map(lambda q: query_batches.get(q)).astype("Int64")
    newest = {(q, op.operator_id, store): op.max_batch_id
              for q, ops in operators.items() for op in ops for store in op.stores}
    frame["metadata_max_batch_id"] = pd.array([newest.get(k) for k in zip(frame["query"], frame["operator_id"],
                                                                          frame["store_name"])], dtype="Int64")
    return frame


def state_suite(cluster: ClusterConfig, plan: PlanConfig) -> tuple[dict[str, Any], Path | str]:
    """The suite a snapshot's exported state is validated with (``snapshot.suite``), and where it is from."""
    return plan_suite(cluster, plan, plan.snapshot.suite, implied_state_suite)


def validate_snapshot(cluster: ClusterConfig, plan: PlanConfig, snapshot_id: str, snapshot_dir: Path,
                      query_batches: Mapping[str, int], rows: pa.Table, fields: pa.Table,
                      operators: Mapping[str, Sequence[StateOperator]], expected_state_rows: int) -> SnapshotValidation:
    """Validate one snapshot: its cut files, then its exported ``rows`` (with their ``fields``) with the plan's suite."""
    problems = check_files(snapshot_dir, query_batches)
    definition, path = state_suite(cluster, plan)
    partitions = [op.partitions for ops in operators.values() for op in ops]
    parameters = {STATE_ROWS_PARAMETER: expected_state_rows,
                  MAX_PARTITION_PARAMETER: max(partitions, default=1) - 1}
    if not any(operators.values()):  # only stateless queries: the cut files are the whole snapshot
        return SnapshotValidation(snapshot_id, not problems, problems, [], definition["name"], 0, parameters)
    frame = state_frame(rows, fields, query_batches, operators)
    outcomes = run_suite(definition, frame, parameters, ["query", "operator_id", "partition_id", "key"], path,
                         asset="state_snapshots")
    return SnapshotValidation(snapshot_id, not problems and all(o.success for o in outcomes), problems, outcomes,
                              definition["name"], len(frame), parameters)
