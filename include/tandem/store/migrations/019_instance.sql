-- One word for the HA unit: "instance" (it was "shard"). Every column named shard_id becomes
-- instance, in the tables of the migrations before this one and in each aggregation's serving table
-- (created by the code, named by the plan), so an installation upgrades in place: a column rename
-- keeps the rows, the keys, the indexes and the constraints that use it.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT table_name FROM information_schema.columns
        WHERE table_schema = current_schema() AND column_name = 'shard_id'
    LOOP
        EXECUTE format('ALTER TABLE %I RENAME COLUMN shard_id TO instance', found.table_name);
    END LOOP;
END $$;

ALTER TABLE backfills RENAME COLUMN shards TO instances;
ALTER INDEX IF EXISTS publish_log_by_shard RENAME TO publish_log_by_instance;
