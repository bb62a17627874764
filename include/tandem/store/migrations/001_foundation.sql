-- Foundation: nodes, plan instances, heartbeats, publish log and the trade aggregate serving table.
-- Later migrations add leases with fencing epochs and failover events; plan_instances already
-- carries role and epoch columns so they need no rework.

CREATE TABLE IF NOT EXISTS nodes (
    name            text PRIMARY KEY,
    spark_master    text NOT NULL,
    airflow_conn_id text NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz
);

-- One row per (plan, shard, node): a running copy of a plan. The instance id is
-- '<plan>/<shard_id>/<node>'. Launch details let a later task find the job again.
CREATE TABLE IF NOT EXISTS plan_instances (
    instance_id     text PRIMARY KEY,
    plan            text NOT NULL,
    shard_id        text NOT NULL,
    node            text NOT NULL REFERENCES nodes(name),
    role            text NOT NULL DEFAULT 'ACTIVE' CHECK (role IN ('ACTIVE', 'PASSIVE', 'BACKUP')),
    epoch           bigint NOT NULL DEFAULT 0,
    status          text NOT NULL DEFAULT 'LAUNCHING'
                    CHECK (status IN ('LAUNCHING', 'STARTING', 'RUNNING', 'STOPPED', 'FAILED')),
    host            text,
    pid             integer,
    submit_pid      integer,
    spark_app_id    text,
    trigger_interval_s double precision,
    checkpoint_root text,
    log_path        text,
    launched_by     text,
    launched_at     timestamptz,
    started_at      timestamptz,
    stopped_at      timestamptz,
    error           text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (plan, shard_id, node)
);

-- Liveness: one row per instance, rewritten every heartbeat interval by a driver thread that
-- does not depend on micro-batches.
CREATE TABLE IF NOT EXISTS liveness (
    instance_id     text PRIMARY KEY REFERENCES plan_instances(instance_id) ON DELETE CASCADE,
    host            text NOT NULL,
    pid             integer NOT NULL,
    beat_at         timestamptz NOT NULL,
    beats           bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL
);

-- Progress: one row per completed micro-batch of every query (StreamingQueryListener).
CREATE TABLE IF NOT EXISTS heartbeats (
    id                  bigserial PRIMARY KEY,
    instance_id         text NOT NULL,
    plan                text NOT NULL,
    shard_id            text NOT NULL,
    node                text NOT NULL,
    query_name          text NOT NULL,
    query_id            uuid NOT NULL,
    run_id              uuid NOT NULL,
    batch_id            bigint NOT NULL,
    input_rows          bigint NOT NULL,
    input_rows_per_s    double precision,
    processed_rows_per_s double precision,
    batch_duration_ms   bigint,
    watermark           timestamptz,
    state_rows          bigint,
    late_rows           bigint,
    quarantined_rows    bigint,
    recorded_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS heartbeats_instance_recent ON heartbeats (instance_id, recorded_at DESC);
CREATE INDEX IF NOT EXISTS heartbeats_plan_recent ON heartbeats (plan, recorded_at DESC);

-- What each instance has published, per output and micro-batch: the active's published
-- position (the HA issue trims a hot standby's pending outputs by it).
CREATE TABLE IF NOT EXISTS publish_log (
    instance_id     text NOT NULL,
    output          text NOT NULL,
    batch_id        bigint NOT NULL,
    epoch           bigint NOT NULL,
    rows            bigint NOT NULL,
    max_event_time  timestamptz,
    published_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, output, batch_id)
);

-- Partial trade aggregates, one row per (granularity, bucket, symbol, shard). Stores sums and
-- counts, never an average: readers merge shards with avg = sum(price_sum) / sum(trade_count).
CREATE TABLE IF NOT EXISTS trade_aggregates (
    granularity     text NOT NULL CHECK (granularity IN ('second', 'minute', 'hour', 'day', 'month', 'year')),
    bucket_start    timestamptz NOT NULL,
    symbol          text NOT NULL,
    shard_id        text NOT NULL,
    price_sum       double precision NOT NULL,
    trade_count     bigint NOT NULL,
    quantity_sum    bigint NOT NULL,
    price_min       double precision NOT NULL,
    price_max       double precision NOT NULL,
    epoch           bigint NOT NULL DEFAULT 0,
    batch_id        bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (granularity, bucket_start, symbol, shard_id)
);
-- Per-symbol range queries: led by the symbol, not only by the bucket.
CREATE INDEX IF NOT EXISTS trade_aggregates_by_symbol ON trade_aggregates (granularity, symbol, bucket_start);
