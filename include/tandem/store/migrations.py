"""Versioned schema migrations, applied idempotently and safely from concurrent starts.

Migrations are the files ``store/migrations/NNN_name.sql``, applied in order inside one
transaction that holds a PostgreSQL advisory lock, so two processes starting at once apply each
migration exactly once. An applied migration whose file changed afterwards is an error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from tandem.errors import StoreError
from tandem.store.db import SCHEMA, Database
from tandem.store.locks import lock_key


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available_migrations() -> list[Migration]:
    """The migration files shipped with the package, in version order."""
    folder = resources.files("tandem.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, rest = entry.name.partition("_")
            found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    if len({m.version for m in found}) != len(found):
        raise StoreError("two migration files share a version number")
    return found


def migrate(db: Database) -> list[int]:
    """Apply every pending migration; return the versions applied by this call."""

    def apply(cursor) -> list[int]:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", lock_key("migrations", SCHEMA))
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        cursor.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        cursor.execute("SELECT version, checksum FROM schema_migrations")
        applied = {row["version"]: row["checksum"] for row in cursor.fetchall()}
        done = []
        for migration in available_migrations():
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    raise StoreError(
                        f"migration {migration.version:03d}_{migration.name}.sql changed after it was applied; "
                        "add a new migration instead of editing an applied one"
                    )
                continue
            cursor.execute(migration.sql)
            cursor.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            done.append(migration.version)
        return done

    return db.run(apply)
