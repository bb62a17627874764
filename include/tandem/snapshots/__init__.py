"""Snapshots: consistent cuts of plan instances, their catalog, retention and restore.

- :mod:`~tandem.snapshots.take`: take a snapshot (cut, state export, output versions at the cut:
  :mod:`tandem.lake.history`, validation) and prune old ones;
- :mod:`~tandem.snapshots.restore`: put an instance back to a snapshot and start it;
- :mod:`~tandem.snapshots.state_export`: the operator state as readable rows in Delta;
- :mod:`~tandem.snapshots.validation`: files and the Great Expectations suite → GOOD or BAD;
- :mod:`~tandem.snapshots.landing`: deleting input nothing needs any more;
- :mod:`~tandem.snapshots.retention` (pure): which snapshots to prune, which landing files to
  delete, which snapshot to restore (which landing files a checkpoint, or a cut of one, has processed:
  :func:`tandem.checkpoints.processed_files`). The catalog lives in PostgreSQL
  (:mod:`tandem.store.snapshots`).
"""

from tandem.checkpoints import processed_files
from tandem.snapshots.retention import (
    KEEP,
    PRUNE,
    TAKING_TIMEOUT_S,
    WAIT,
    LandingDecision,
    RetentionPlan,
    SnapshotDecision,
    choose_snapshot,
    decide_landing_retention,
    decide_retention,
    landing_file_key,
)

__all__ = ["KEEP", "PRUNE", "TAKING_TIMEOUT_S", "WAIT", "LandingDecision", "RetentionPlan", "SnapshotDecision",
           "choose_snapshot", "decide_landing_retention", "decide_retention", "landing_file_key", "processed_files"]
