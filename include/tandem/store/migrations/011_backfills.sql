-- Issue 27 §1: backfills, the recomputations of a closed event-time range of a plan's outputs.
--
-- One row per backfill: RUNNING while it recomputes and replaces, then DONE (report: what changed per
-- instance and output) or FAILED (error). Two RUNNING backfills of one plan never overlap: a new one is
-- registered under the plan's advisory lock after checking the RUNNING ones.
CREATE TABLE IF NOT EXISTS backfills (
    id          text PRIMARY KEY,                 -- <plan>-<yyyymmddThhmmssZ>-<random>
    plan        text NOT NULL,
    range_start timestamptz NOT NULL,
    range_end   timestamptz NOT NULL,
    shards      text[] NOT NULL,
    status      text NOT NULL DEFAULT 'RUNNING' CHECK (status IN ('RUNNING', 'DONE', 'FAILED')),
    requested_by text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    report      jsonb NOT NULL DEFAULT '{}'::jsonb,
    error       text,
    CHECK (range_start < range_end)
);
CREATE INDEX IF NOT EXISTS backfills_by_plan ON backfills (plan, started_at DESC);
