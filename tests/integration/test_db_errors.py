"""Only connection failures are retried; every other error fails at once with its own cause (issue 9, item 10)."""

from __future__ import annotations

import logging
import time

import pytest

from tandem.errors import StoreError, StoreUnreachable
from tandem.redaction import redact
from tandem.store.db import Database
from tandem.store.migrations import migrate

pytestmark = pytest.mark.integration
SECRET = "S3cr3tPw"


def test_a_role_that_does_not_exist_fails_at_once_with_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match='role "no_such_role" does not exist') as caught:
        Database(f"postgresql://no_such_role:{SECRET}@127.0.0.1:5432/postgres").run(lambda c: c.execute("SELECT 1"))
    assert time.monotonic() - started < 5, "a wrong role was retried"
    assert not isinstance(caught.value, StoreUnreachable) and "unreachable" not in str(caught.value)
    assert SECRET not in str(caught.value) and "no_such_role@127.0.0.1:5432/postgres" in str(caught.value)
    assert "attempt" not in caplog.text


def test_an_unreachable_server_is_retried_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tandem.store.db")
    with pytest.raises(StoreUnreachable, match="unreachable after 3 attempts") as caught:
        Database(f"postgresql://u:{SECRET}@127.0.0.1:1/x").run(lambda c: c.execute("SELECT 1"), attempts=3, delay_s=0.1)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "PostgreSQL unreachable (attempt 1/3)", "PostgreSQL unreachable (attempt 2/3)"]
    assert SECRET not in str(caught.value) and SECRET not in caplog.text


def test_a_migration_changed_after_it_was_applied_fails_at_once(database_url: str) -> None:
    with Database(database_url) as db:
        migrate(db)
        db.run(lambda c: c.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1"))
        started = time.monotonic()
        with pytest.raises(StoreError, match="001_foundation.sql changed after it was applied"):
            migrate(db)
    assert time.monotonic() - started < 5


def test_a_bad_percent_escape_is_an_error_without_the_password() -> None:
    url = f"postgresql://u:{SECRET}%zz@127.0.0.1:5432/x"
    with pytest.raises(StoreError) as caught:
        Database(url).run(lambda c: c.execute("SELECT 1"))
    assert "cannot parse" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("url", [
    f"postgresql://u:{SECRET}@db.example:5433/tandem",
    f"postgresql://u@db.example:5433/tandem?password={SECRET}",
    f"postgresql://u:{SECRET}%40x@db.example:5433/tandem?sslmode=require",
    f"host=db.example port=5433 user=u password={SECRET} dbname=tandem",
    f"postgresql://u:{SECRET}%zz@db.example/tandem",
])
def test_redact_never_shows_the_password(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown
    assert shown == "postgresql://u@db.example:5433/tandem" or "cannot parse" in shown
