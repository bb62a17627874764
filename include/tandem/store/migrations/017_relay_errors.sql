-- Issue 46 §3: the relay of a plan's events outputs to NATS never fails silently. While a round of an
-- instance's relay fails (NATS or PostgreSQL out of reach, a stream that cannot say how far publishing got,
-- a malformed header), the instance records the error here; `tandem status` and the Tandem page show it, and
-- the relay clears it when a round goes through again (or when it stops).
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS relay_error text;
ALTER TABLE plan_instances ADD COLUMN IF NOT EXISTS relay_error_at timestamptz;
