"""The storage layout under ``storage_root`` (see DESIGN.md): one function per kind of place."""

from __future__ import annotations

from pathlib import Path

from tandem.config import ClusterConfig


def landing_dir(cluster: ClusterConfig, stream: str, shard_id: str) -> Path:
    """Input files of one shard: ``landing/<stream>/<shard_id>/``."""
    return cluster.storage_root / "landing" / stream / shard_id


def checkpoint_dir(cluster: ClusterConfig, plan: str, shard_id: str, node: str, query: str) -> Path:
    """One query's checkpoint; never shared: ``checkpoints/<plan>/<shard_id>/<node>/<query>/``."""
    return cluster.storage_root / "checkpoints" / plan / shard_id / node / query


def delta_table_dir(cluster: ClusterConfig, plan: str, table: str) -> Path:
    """A Delta table of a plan: ``delta/<plan>/<table>/``."""
    return cluster.storage_root / "delta" / plan / table


def snapshots_dir(cluster: ClusterConfig, plan: str) -> Path:
    """Where a plan's snapshot copies live: ``snapshots/<plan>/``."""
    return cluster.storage_root / "snapshots" / plan


def snapshot_dir(cluster: ClusterConfig, plan: str, snapshot_id: str) -> Path:
    """One snapshot's checkpoint cut: ``snapshots/<plan>/<id>/``."""
    return snapshots_dir(cluster, plan) / snapshot_id
