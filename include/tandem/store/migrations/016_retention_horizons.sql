-- What the retention deleted (issue 46 §4): per plan and kind of row, rows older than `before` may be gone.
-- A backfill refuses a range that would need them (tandem.batch.backfill.retention_refusal): ids of rows
-- published once by id ('contributions/<instance>', by when they were applied), an aggregation's partials
-- ('partials/<table>/<granularity>', by bucket start). A kind never trimmed has no row: nothing of it is gone.
CREATE TABLE IF NOT EXISTS retention_horizons (
    plan       text NOT NULL,
    what       text NOT NULL,
    before     timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, what)
);
