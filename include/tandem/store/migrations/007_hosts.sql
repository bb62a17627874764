-- Issue 12: nodes on separate hosts.
--
-- A stop request is how one host asks a driver on another host to stop: PIDs mean nothing across
-- hosts. The driver reads it with every liveness beat and stops gracefully; a new launch clears it
-- (a request is for the run it was made against, never for the next one).
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS stop_requested_at timestamptz;
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS stop_requested_by text;

-- The shared storage root: the first node to start records a random token that it also wrote into
-- <storage_root>/.tandem-storage; every node checks that it reads the same token from its own host.
CREATE TABLE IF NOT EXISTS storage_marker (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    token text NOT NULL,
    storage_root text NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Each node's latest check of the marker, from its own host.
CREATE TABLE IF NOT EXISTS storage_checks (
    node text PRIMARY KEY,
    host text NOT NULL,
    ok boolean NOT NULL,
    detail text NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now()
);
