-- Issue 47: the latest output kind: per key, the row of the latest event time (ties broken by the row's tiebreak).
--
-- output_latest: each instance's latest row of each key (merged on read: the latest over the instances). A row
-- only replaces one of an earlier (event_time, tiebreak), so a replay, a backfill or a stale ACTIVE's older row
-- never moves a key backwards. in_lake: the row's Delta copy is committed (a standby drops a held row only then).
CREATE TABLE IF NOT EXISTS output_latest (
    plan       text        NOT NULL,
    output     text        NOT NULL,
    key        jsonb       NOT NULL,
    shard_id   text        NOT NULL,
    event_time timestamptz NOT NULL,
    tiebreak   text        NOT NULL,
    row        jsonb       NOT NULL,
    node       text        NOT NULL,
    epoch      bigint      NOT NULL,
    batch_id   bigint      NOT NULL,
    in_lake    boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, output, key, shard_id)
);
CREATE INDEX IF NOT EXISTS output_latest_by_time ON output_latest (plan, output, event_time);
