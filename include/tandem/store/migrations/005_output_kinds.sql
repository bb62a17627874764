-- Issue 10: the events and table output kinds of any plan.
--
-- output_events: append-only notifications, exactly one row per (plan, output, event_id). The id is
-- computed from the event's inputs, the same on every replica, so a standby that publishes what
-- it held after a failover finds the rows the old active published and adds only the rest.
-- in_lake: the row's Delta copy is committed (a standby drops a held event only then).
CREATE TABLE IF NOT EXISTS output_events (
    plan         text        NOT NULL,
    output       text        NOT NULL,
    event_id     text        NOT NULL,
    shard_id     text        NOT NULL,
    event_time   timestamptz NOT NULL,
    payload      jsonb       NOT NULL,
    node         text        NOT NULL,
    epoch        bigint      NOT NULL,
    batch_id     bigint      NOT NULL,
    in_lake      boolean     NOT NULL DEFAULT false,
    published_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, output, event_id)
);
CREATE INDEX IF NOT EXISTS output_events_by_time ON output_events (plan, output, event_time);
CREATE INDEX IF NOT EXISTS output_events_not_in_lake ON output_events (plan, output, shard_id) WHERE NOT in_lake;

-- output_table_rows: each instance's partial value of a keyed table (merge: sum adds the
-- instances' values on read); version counts the contributions applied, so it only grows.
CREATE TABLE IF NOT EXISTS output_table_rows (
    plan       text        NOT NULL,
    output     text        NOT NULL,
    key        jsonb       NOT NULL,
    shard_id   text        NOT NULL,
    value      jsonb       NOT NULL,
    version    bigint      NOT NULL,
    node       text        NOT NULL,
    epoch      bigint      NOT NULL,
    batch_id   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, output, key, shard_id)
);

-- output_contributions: every row applied to a table, by its deterministic id, so it is applied
-- once whoever publishes it; in_lake as for events (the key's new value is in Delta).
CREATE TABLE IF NOT EXISTS output_contributions (
    plan            text    NOT NULL,
    output          text    NOT NULL,
    contribution_id text    NOT NULL,
    shard_id        text    NOT NULL,
    key             jsonb   NOT NULL,
    in_lake         boolean NOT NULL DEFAULT false,
    PRIMARY KEY (plan, output, contribution_id)
);
CREATE INDEX IF NOT EXISTS output_contributions_not_in_lake ON output_contributions (plan, output, shard_id)
    WHERE NOT in_lake;
