-- Issue 11: clients poll an events output after a cursor, without gaps or repeats.
--
-- A time-ordered cursor can skip rows: a publisher whose transaction commits late inserts events
-- "behind" a position a poller already passed. Each row records the id of the transaction that
-- inserted it (xid8 never wraps), and a poll only returns rows whose transaction is below the
-- reader's snapshot xmin: every such transaction has ended, so no row can appear below that
-- point later. Polling in (xid, event_id) order from a cursor therefore returns every row once.
-- Rows that existed before this migration share the migrating transaction's id.
ALTER TABLE output_events ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS output_events_by_xid ON output_events (plan, output, xid, event_id);
