-- Issue 27: PostgreSQL retention of a plan's bookkeeping rows (tandem.batch.trim, the maintenance DAG).
--
-- A contribution id must outlive every replay that may bring its row again (a standby's held rows, a
-- restore's replay after a kept snapshot's cut); applied_at says when it was applied, so the ids older
-- than the plan's retention and than its oldest kept snapshot can go. Rows that existed before this
-- migration count as applied now. The indexes let the hourly deletes find old rows without a scan.
ALTER TABLE output_contributions ADD COLUMN IF NOT EXISTS applied_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX IF NOT EXISTS output_contributions_by_age ON output_contributions (plan, applied_at);
CREATE INDEX IF NOT EXISTS publish_log_by_age ON publish_log (plan, published_at);
