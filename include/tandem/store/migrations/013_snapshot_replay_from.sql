-- When the oldest batch a restore from the snapshot would replay can have started (PostgreSQL's clock): its cut's
-- earliest commit, per query. Contribution ids applied since stay while the snapshot is kept (tandem.batch.trim);
-- NULL for snapshots taken before it was recorded (an hour before taken_at is assumed then).
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS replay_from timestamptz;
