-- Exact identities instead of string prefixes and bare PIDs (issue 9).
--
-- 1. A PID alone does not name a process: it is reused once the process exits. Every recorded PID
--    now carries the process's start time (seconds since the epoch, as the kernel reports it), and
--    nothing is signalled unless both still match and its command line names the instance.
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS submit_started_at double precision;
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS pid_started_at double precision;

-- 2. publish_log rows were found by `instance_id LIKE 'plan/shard/%'`, where `_` matches any
--    character (shard_1 matched shard-1). Plan, shard and node are columns now.
ALTER TABLE publish_log ADD COLUMN IF NOT EXISTS plan text;
ALTER TABLE publish_log ADD COLUMN IF NOT EXISTS shard_id text;
ALTER TABLE publish_log ADD COLUMN IF NOT EXISTS node text;
UPDATE publish_log SET plan = split_part(instance_id, '/', 1), shard_id = split_part(instance_id, '/', 2),
                       node = split_part(instance_id, '/', 3)
 WHERE plan IS NULL;
ALTER TABLE publish_log ALTER COLUMN plan SET NOT NULL;
ALTER TABLE publish_log ALTER COLUMN shard_id SET NOT NULL;
ALTER TABLE publish_log ALTER COLUMN node SET NOT NULL;
ALTER TABLE publish_log ADD CONSTRAINT publish_log_instance_parts
    CHECK (instance_id = plan || '/' || shard_id || '/' || node);
CREATE INDEX IF NOT EXISTS publish_log_by_shard ON publish_log (plan, shard_id, output);

-- 3. The serving table had no plan column: two plans with the same aggregation wrote the same
--    rows, and restoring one deleted the other's. Rows written before this migration can only
--    have come from the plan named after the aggregation (the spec was hard-coded to `trades`).
ALTER TABLE trade_aggregates ADD COLUMN IF NOT EXISTS plan text;
UPDATE trade_aggregates SET plan = 'trades' WHERE plan IS NULL;
ALTER TABLE trade_aggregates ALTER COLUMN plan SET NOT NULL;
ALTER TABLE trade_aggregates DROP CONSTRAINT trade_aggregates_pkey;
ALTER TABLE trade_aggregates ADD PRIMARY KEY (plan, granularity, bucket_start, symbol, shard_id);
DROP INDEX IF EXISTS trade_aggregates_by_symbol;
CREATE INDEX trade_aggregates_by_symbol ON trade_aggregates (plan, granularity, symbol, bucket_start);
