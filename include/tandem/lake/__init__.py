"""Delta tables through ``deltalake`` (delta-rs): idempotent appends and reads."""

from tandem.lake.tables import append_once, read_table, table_exists

__all__ = ["append_once", "read_table", "table_exists"]
