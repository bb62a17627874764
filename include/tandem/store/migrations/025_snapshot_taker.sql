-- Issue 60: who is taking a TAKING snapshot and when it last showed progress, so that one whose taker is gone
-- (its process on its host, or no progress beat for a short while) stops holding back retention at once instead of
-- for an hour (tandem.snapshots.takers). Rows taken before keep NULLs and the hour.
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS taker_host text;
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS taker_host_id text;
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS taker_pid integer;
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS taker_started_at double precision;
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS progress_at timestamptz;
