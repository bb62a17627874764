-- Issue 48: the version of its plan (YAML, module, Tandem) each instance runs, recorded when its driver starts
-- (tandem.plan_version): the status shows it beside the version the files define now.
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS plan_version text;
