-- Issue 60: a host's identity beside its name (tandem.host_identity: machine id, boot id, PID namespace). Two hosts
-- may share a name; a recorded PID is local only where the identity recorded with it is this host's. Rows recorded
-- before keep NULL and are judged by their host name.
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS host_id text;
