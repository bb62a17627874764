"""Re-sync: a node's instance resumes where another node's instance stands (a checkpoint cut copied over)."""

from __future__ import annotations

from tandem.checkpoints import CheckpointError, CutInfo, cut_checkpoint, query_dirs
from tandem.config import ClusterConfig, PlanConfig
from tandem.layout import checkpoint_dir


def resync_instance(cluster: ClusterConfig, plan: PlanConfig | str, shard_id: str, source_node: str,
                    target_node: str) -> dict[str, CutInfo]:
    """Cut every query checkpoint of ``source_node``'s instance into ``target_node``'s own locations.

    Returns the cut per query; empty when the source instance has no checkpoint yet. Queries the
    source has not committed anything for keep the target's own checkpoint.
    """
    name = plan.name if isinstance(plan, PlanConfig) else plan
    if source_node == target_node:
        raise CheckpointError(f"cannot re-sync {target_node} from itself")
    source_root = checkpoint_dir(cluster, name, shard_id, source_node, "")
    cuts = {}
    for query, directory in sorted(query_dirs(source_root).items()):
        cuts[query] = cut_checkpoint(directory, checkpoint_dir(cluster, name, shard_id, target_node, query))
    return cuts
