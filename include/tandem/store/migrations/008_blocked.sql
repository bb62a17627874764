-- Issue 24: an instance that fails the same way on the same batch again is BLOCKED, not relaunched.
--
-- failure is what the run's failure was, in words that are the same when it repeats: the query, the
-- batch and its checkpoint's lineage, and the error's first line. failure_repeats counts the runs in a
-- row that ended with that same failure; an operator's restart of the node clears both.
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS failure text;
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS failure_repeats integer NOT NULL DEFAULT 0;
ALTER TABLE plan_instances DROP CONSTRAINT IF EXISTS plan_instances_status_check;
ALTER TABLE plan_instances ADD CONSTRAINT plan_instances_status_check
    CHECK (status IN ('LAUNCHING', 'STARTING', 'RUNNING', 'STOPPED', 'FAILED', 'BLOCKED'));
