-- High availability: the ACTIVE role of each (plan, shard) is a lease with a fencing epoch, and
-- every role change is an event. plan_instances.role / epoch (001) hold each instance's view.

CREATE TABLE IF NOT EXISTS leases (
    plan            text NOT NULL,
    shard_id        text NOT NULL,
    holder          text,                        -- node of the ACTIVE instance
    epoch           bigint NOT NULL DEFAULT 0,   -- +1 on every change of holder; writes carry it
    ttl_s           double precision NOT NULL,   -- heartbeat_interval × max_missed
    expires_at      timestamptz NOT NULL,
    acquired_at     timestamptz,
    renewed_at      timestamptz,
    PRIMARY KEY (plan, shard_id)
);

CREATE TABLE IF NOT EXISTS failover_events (
    id              bigserial PRIMARY KEY,
    plan            text NOT NULL,
    shard_id        text NOT NULL,
    happened_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind            text NOT NULL,               -- PROMOTED, DEMOTED, FENCED, STARTED, RELAUNCHED, ...
    node            text,                        -- the node the event is about
    previous_node   text,                        -- e.g. the holder a promotion took over from
    epoch           bigint,
    reason          text NOT NULL,
    detail          jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS failover_events_recent ON failover_events (plan, shard_id, happened_at DESC);

-- The active's published position: the event-time watermark its query had reached when it
-- published a batch. A hot standby drops pending outputs that are final at or before it.
ALTER TABLE publish_log ADD COLUMN IF NOT EXISTS watermark timestamptz;
