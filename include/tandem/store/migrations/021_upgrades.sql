-- Issue 48 §2: a blue/green upgrade of a plan's instance (tandem.supervisor.upgrade). One row per instance: the
-- upgrade under way or the last one; its steps are also events in failover_events. upgrade_checks counts what a
-- shadow standby of the new version compared with what the ACTIVE (the old version) published, per output.
CREATE TABLE IF NOT EXISTS plan_upgrades (
    plan text NOT NULL,
    instance text NOT NULL,
    state text NOT NULL,
    from_version text,
    to_version text NOT NULL,
    from_node text NOT NULL,
    shadow_node text NOT NULL,
    detail text NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, instance)
);

CREATE TABLE IF NOT EXISTS upgrade_checks (
    plan text NOT NULL,
    instance text NOT NULL,
    node text NOT NULL,
    to_version text NOT NULL,
    output text NOT NULL,
    checked bigint NOT NULL DEFAULT 0,
    differing bigint NOT NULL DEFAULT 0,
    samples jsonb NOT NULL DEFAULT '[]'::jsonb,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, instance, node, to_version, output)
);
