"""An installation made before "shard" became "instance" upgrades in place (issue 47 §5).

PostgreSQL: a database at migration 18 with rows in the catalog tables and in an aggregation's serving table (made
as the code before the rename made it) is migrated; every ``shard_id`` column is ``instance`` with its rows, keys,
constraints and indexes. Delta: a table written with ``shard_id`` reads as ``instance`` at every version, is
rewritten once with the new name, and takes appends and slice overwrites under the new name afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from tandem.lake.history import instance_slice
from tandem.lake.tables import append_once, has_legacy_columns, read_table, rename_legacy_columns
from tandem.store.db import SCHEMA, Database
from tandem.store.migrations import available_migrations, migrate

LAST_BEFORE_RENAME = 18


def migrate_to(db: Database, version: int) -> None:
    """The schema as an installation at ``version`` has it (the migrations are applied as ``migrate`` applies them)."""
    def work(cursor) -> None:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        cursor.execute("""CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                          checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())""")
        for migration in available_migrations():
            if migration.version <= version:
                cursor.execute(migration.sql)
                cursor.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                               (migration.version, migration.name, migration.checksum))
    db.run(work)


def columns(db: Database, table: str) -> set[str]:
    return {row["column_name"] for row in db.run(lambda c: (c.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (SCHEMA, table)), c.fetchall())[1])}


def test_a_database_at_migration_18_keeps_its_rows_under_the_new_names(database_url: str) -> None:
    with Database(database_url) as db:
        migrate_to(db, LAST_BEFORE_RENAME)

        def old_rows(cursor) -> None:
            cursor.execute("""INSERT INTO leases (plan, shard_id, holder, epoch, ttl_s, expires_at)
                              VALUES ('p', 'g-1', 'node-a', 3, 6, now())""")
            cursor.execute("""INSERT INTO publish_log (instance_id, plan, shard_id, node, output, batch_id, epoch, rows)
                              VALUES ('p/g-1/node-a', 'p', 'g-1', 'node-a', 'stats', 7, 3, 10)""")
            cursor.execute("""INSERT INTO backfills (id, plan, range_start, range_end, shards, requested_by)
                              VALUES ('b1', 'p', now() - interval '1 hour', now(), ARRAY['g-1', 'g-2'], 'test')""")
            # an aggregation's serving table as the code before the rename created it
            cursor.execute("""CREATE TABLE login_stats (plan text NOT NULL, granularity text NOT NULL,
                                  bucket_start timestamptz NOT NULL, tenant text NOT NULL, shard_id text NOT NULL,
                                  n bigint NOT NULL, epoch bigint NOT NULL, batch_id bigint NOT NULL,
                                  PRIMARY KEY (plan, granularity, bucket_start, tenant, shard_id))""")
            cursor.execute("""INSERT INTO login_stats VALUES ('p', 'second', '2026-01-01', 'acme', 'g-1', 4, 3, 7),
                                                             ('p', 'second', '2026-01-01', 'acme', 'g-2', 5, 1, 2)""")
        db.run(old_rows)

        assert migrate(db) == [v.version for v in available_migrations() if v.version > LAST_BEFORE_RENAME]

        for table in ("plan_instances", "heartbeats", "leases", "failover_events", "snapshots", "publish_log",
                      "trade_aggregates", "output_events", "output_table_rows", "output_contributions",
                      "output_latest", "login_stats"):
            found = columns(db, table)
            assert "instance" in found and "shard_id" not in found, (table, found)
        assert {"instances"} <= columns(db, "backfills") and "shards" not in columns(db, "backfills")

        def read(cursor) -> dict:
            cursor.execute("SELECT plan, instance, holder, epoch FROM leases")
            leases = cursor.fetchall()
            cursor.execute("SELECT instance, sum(n) AS n FROM login_stats GROUP BY instance ORDER BY instance")
            stats = cursor.fetchall()
            cursor.execute("SELECT instances FROM backfills")
            backfills = cursor.fetchall()
            cursor.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'publish_log'",
                           (SCHEMA,))
            indexes = {row["indexname"] for row in cursor.fetchall()}
            return {"leases": leases, "stats": stats, "backfills": backfills, "indexes": indexes}
        found = db.run(read)
        assert [dict(r) for r in found["leases"]] == [{"plan": "p", "instance": "g-1", "holder": "node-a", "epoch": 3}]
        assert [(r["instance"], r["n"]) for r in found["stats"]] == [("g-1", 4), ("g-2", 5)]
        assert [r["instances"] for r in found["backfills"]] == [["g-1", "g-2"]]
        assert "publish_log_by_instance" in found["indexes"] and "publish_log_by_shard" not in found["indexes"]

        # the primary key and the publish_log check follow the renamed column
        with pytest.raises(psycopg2.errors.UniqueViolation):
            db.run(lambda c: c.execute("INSERT INTO login_stats VALUES "
                                       "('p', 'second', '2026-01-01', 'acme', 'g-1', 1, 3, 8)"))
        with pytest.raises(psycopg2.errors.CheckViolation):
            db.run(lambda c: c.execute("""INSERT INTO publish_log (instance_id, plan, instance, node, output,
                                              batch_id, epoch, rows)
                                          VALUES ('p/g-2/node-a', 'p', 'g-1', 'node-a', 'stats', 8, 3, 1)"""))
        assert migrate(db) == []


def test_a_delta_table_written_with_shard_id_reads_and_upgrades_as_instance(tmp_path: Path) -> None:
    path = tmp_path / "stats"
    old = pa.table({"shard_id": ["g-1", "g-2"], "n": [4, 5]})
    write_deltalake(str(path), old)  # version 0, as before the rename
    write_deltalake(str(path), pa.table({"shard_id": ["g-1"], "n": [6]}), mode="append")  # version 1

    assert has_legacy_columns(path)
    mine = read_table(path, ds.field("instance") == "g-1", ["instance", "n"])
    assert sorted(mine.to_pylist(), key=lambda r: r["n"]) == [{"instance": "g-1", "n": 4}, {"instance": "g-1", "n": 6}]

    assert rename_legacy_columns(path) is True
    assert not has_legacy_columns(path) and rename_legacy_columns(path) is False
    assert pa.schema(DeltaTable(str(path)).schema().to_arrow()).names == ["instance", "n"]
    assert sorted(read_table(path).to_pylist(), key=lambda r: r["n"]) == [
        {"instance": "g-1", "n": 4}, {"instance": "g-2", "n": 5}, {"instance": "g-1", "n": 6}]
    # an older version (a snapshot's) still reads under today's name
    assert read_table(path, ds.field("instance") == "g-2", version=0).to_pylist() == [{"instance": "g-2", "n": 5}]
    assert instance_slice(path, "g-1", 0).to_pylist() == [{"instance": "g-1", "n": 4}]

    assert append_once(path, pa.table({"instance": ["g-2"], "n": [7]}), "p/g-2/node-a/stats", 1)
    assert sorted(r["n"] for r in read_table(path, ds.field("instance") == "g-2").to_pylist()) == [5, 7]


def test_a_command_on_a_database_not_migrated_yet_says_to_migrate(project: Path, database_url: str) -> None:
    with Database(database_url) as db:
        migrate_to(db, LAST_BEFORE_RENAME)
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "snapshots", "trades"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "run `tandem migrate`" in done.stderr, done.stderr
    assert done.stderr.startswith('error: column "instance" does not exist'), done.stderr
