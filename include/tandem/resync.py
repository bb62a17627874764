"""Re-sync: a node's instance resumes where another node's instance stands (a checkpoint cut copied over)."""

from __future__ import annotations

import logging
import time
from typing import Any

from tandem.checkpoints import GUARD_WINDOW_S, CheckpointError, CutInfo, cut_checkpoint, last_changed, query_dirs
from tandem.config import ClusterConfig, PlanConfig
from tandem.layout import checkpoint_dir
from tandem.store.db import Database
from tandem.store.supervision import mark

log = logging.getLogger(__name__)


def resync_instance(cluster: ClusterConfig, plan: PlanConfig | str, instance: str, source_node: str,
                    target_node: str) -> dict[str, CutInfo]:
    """Cut every query checkpoint of ``source_node``'s instance into ``target_node``'s own locations.

    Returns the cut per query; empty when the source instance has no checkpoint yet. Queries the
    source has not committed anything for keep the target's own checkpoint.
    """
    name = plan.name if isinstance(plan, PlanConfig) else plan
    if source_node == target_node:
        raise CheckpointError(f"cannot re-sync {target_node} from itself")
    source_root = checkpoint_dir(cluster, name, instance, source_node, "")
    cuts = {}
    for query, directory in sorted(query_dirs(source_root).items()):
        cuts[query] = cut_checkpoint(directory, checkpoint_dir(cluster, name, instance, target_node, query))
    return cuts


def resync_recorded(db: Database, cluster: ClusterConfig, plan: PlanConfig, instance: str, source_node: str,
                    target_node: str, logger: logging.Logger | logging.LoggerAdapter | None = None,
                    ) -> dict[str, dict[str, Any]] | None:
    """:func:`resync_instance` with its outcome in ``failover_events`` (RESYNC with the cut of each query, or
    RESYNC_FAILED): the cut per query, or ``None`` when it failed (the target then starts from its own checkpoint).

    Raises:
        CheckpointError: the re-sync failed and the target's own checkpoint was left behind by landing retention
            (unchanged for longer than :data:`~tandem.checkpoints.GUARD_WINDOW_S`): input it has not read
            may be gone, and a start from it would skip that input silently.
    """
    logger = logger or log
    try:
        cuts = resync_instance(cluster, plan, instance, source_node, target_node)
    except CheckpointError as exc:
        changed = last_changed(checkpoint_dir(cluster, plan.name, instance, target_node, ""))
        idle_s = None if changed is None else time.time() - changed
        left_behind = idle_s is not None and idle_s > GUARD_WINDOW_S
        why = (f"re-sync of {target_node} from {source_node} failed ({exc}) and {target_node}'s own checkpoint "
               f"is unchanged for {idle_s:.0f} s: landing retention no longer keeps the input it has not read, "
               f"so it does not start from it; repair {source_node}'s checkpoint or restore a snapshot "
               f"(tandem restore {plan.name})") if left_behind else str(exc)
        mark(db, plan.name, instance, "RESYNC_FAILED", why[:2000], node=target_node, previous_node=source_node)
        if left_behind:
            raise CheckpointError(why) from exc
        logger.warning("re-sync of %s from %s failed, starting from its own checkpoint: %s",
                       target_node, source_node, exc)
        return None
    cut = {q: {"batch_id": c.batch_id, "files": c.files, "bytes": c.bytes} for q, c in cuts.items()}
    summary = ", ".join(f"{q} at batch {c.batch_id} ({c.files} files, {c.bytes} bytes)"
                        if c.batch_id is not None else f"{q}: nothing committed"
                        for q, c in cuts.items()) or "no checkpoint"
    mark(db, plan.name, instance, "RESYNC", f"checkpoint cut of {source_node} copied to {target_node}: {summary}",
         node=target_node, previous_node=source_node, detail=cut)
    logger.info("re-synced %s from %s: %s", target_node, source_node, summary)
    return cut
