-- Issue 60: an upgrade whose new version changes how rows are identified (a key field computed another way) must
-- not hand over (or roll back) and publish the same events again under new ids.
-- upgrade_checks.unmatched: rows a standby held that the other version never published under their identity,
-- though it had published rows of later batches (tandem.outputs.base.HeldUntilPublished.trim).
-- output_contributions.value: the values each contribution added, so that a shadow compares a table's rows with
-- what the ACTIVE applied under the same id (NULL for contributions applied before this migration).
ALTER TABLE upgrade_checks ADD COLUMN IF NOT EXISTS unmatched bigint NOT NULL DEFAULT 0;
ALTER TABLE output_contributions ADD COLUMN IF NOT EXISTS value jsonb;
