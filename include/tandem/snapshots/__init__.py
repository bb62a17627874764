"""Snapshots: consistent cuts of plan instances, their catalog, retention and restore.

Decisions are pure functions (:mod:`tandem.snapshots.retention`: which snapshots to prune, which
landing files to delete, which snapshot to restore); :mod:`tandem.snapshots.source_log` reads
which landing files a checkpoint (or a cut of one) has processed; the catalog lives in PostgreSQL
(:mod:`tandem.store.snapshots`). Taking a cut, exporting state and restoring come next.
"""

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
from tandem.snapshots.source_log import processed_files

__all__ = ["KEEP", "PRUNE", "TAKING_TIMEOUT_S", "WAIT", "LandingDecision", "RetentionPlan", "SnapshotDecision",
           "choose_snapshot", "decide_landing_retention", "decide_retention", "landing_file_key", "processed_files"]
