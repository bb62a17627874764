-- Issue 49: what `tandem exporter` reads besides the tables it already had. The memory Spark's state stores used
-- after each batch (the query progress' stateOperators[].memoryUsedBytes), and one row per run of a plan's batch
-- jobs (reconcile, backfill, maintenance tasks) with its result, so that a failed maintenance can raise an alert.
ALTER TABLE heartbeats ADD COLUMN IF NOT EXISTS state_memory_bytes bigint;

CREATE TABLE IF NOT EXISTS job_runs (
    id          bigserial PRIMARY KEY,
    plan        text NOT NULL,
    job         text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    result      text NOT NULL DEFAULT 'RUNNING' CHECK (result IN ('RUNNING', 'SUCCESS', 'FAILURE')),
    detail      text NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS job_runs_recent ON job_runs (plan, job, started_at DESC);
