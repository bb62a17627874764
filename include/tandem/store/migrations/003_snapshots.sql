-- Snapshots: the catalog of consistent cuts of plan instances (one row per snapshot).
-- The cut copy of the checkpoint lives at checkpoint_path (<storage_root>/snapshots/<plan>/<id>/),
-- the exported state in the Delta table delta/<plan>/state_snapshots (rows carry the snapshot id).
--
-- Life of a row: TAKING (inserted before the copy starts; the cut's batch, sizes and output
-- versions are filled in while it is TAKING) -> GOOD or BAD (validated) -> PRUNED (its files were
-- deleted; the row stays as history). A GOOD snapshot found broken later may become BAD.

CREATE TABLE IF NOT EXISTS snapshots (
    id                  text PRIMARY KEY,             -- <plan>-<shard_id>-<yyyymmddThhmmssZ>-<random>
    plan                text NOT NULL,
    shard_id            text NOT NULL,
    instance_id         text NOT NULL,                -- <plan>/<shard_id>/<node> the cut was taken from
    node                text NOT NULL,
    batch_id            bigint,                       -- the stateful query's committed batch N at the cut
    taken_at            timestamptz NOT NULL,         -- when taking started (PostgreSQL's clock)
    completed_at        timestamptz,                  -- when it was marked GOOD or BAD
    checkpoint_path     text NOT NULL,                -- where the checkpoint cut is copied
    state_rows          bigint,                       -- rows exported to state_snapshots
    checkpoint_bytes    bigint,
    state_bytes         bigint,
    query_batches       jsonb NOT NULL DEFAULT '{}'::jsonb,   -- query name -> its committed batch at the cut
                                                      -- (each query of the instance has its own checkpoint)
    output_versions     jsonb NOT NULL DEFAULT '{}'::jsonb,   -- Delta table name -> version at the cut
    status              text NOT NULL DEFAULT 'TAKING'
                        CHECK (status IN ('TAKING', 'GOOD', 'BAD', 'PRUNED')),
    validation          jsonb,                        -- the validation result (expectations and their outcome)
    reason              text,                         -- why BAD or PRUNED
    pruned_at           timestamptz,
    CHECK (status <> 'GOOD' OR (batch_id IS NOT NULL AND completed_at IS NOT NULL)),
    CHECK ((status = 'PRUNED') = (pruned_at IS NOT NULL)),
    CHECK (batch_id IS NULL OR batch_id >= 0),
    CHECK (jsonb_typeof(output_versions) = 'object'),
    CHECK (jsonb_typeof(query_batches) = 'object')
);

-- Restore and retention ask for the newest GOOD snapshot of one (plan, shard): a small partial index.
CREATE INDEX IF NOT EXISTS snapshots_good_newest ON snapshots (plan, shard_id, taken_at DESC, id DESC)
    WHERE status = 'GOOD';
-- Listing a plan's snapshots, newest first (tandem snapshots <plan>, retention).
CREATE INDEX IF NOT EXISTS snapshots_by_plan ON snapshots (plan, taken_at DESC, id DESC);
