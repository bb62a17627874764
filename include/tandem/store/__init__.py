"""The coordination store in PostgreSQL (schema ``tandem``)."""

from tandem.store.db import Database, connect, redact
from tandem.store.migrations import migrate

__all__ = ["Database", "connect", "migrate", "redact"]
