-- Issue 28: a WARM standby (Spark session built, no query running until it takes over).
ALTER TABLE plan_instances DROP CONSTRAINT IF EXISTS plan_instances_role_check;
ALTER TABLE plan_instances ADD CONSTRAINT plan_instances_role_check
    CHECK (role IN ('ACTIVE', 'PASSIVE', 'BACKUP', 'WARM'));
