-- A micro-batch longer than ha.stall_timeout is not a stall while its work advances: the driver's liveness
-- beat records when it last saw a Spark task of the instance complete or a stage start (tandem.runtime.listener
-- .SparkWorkProbe), and the supervisor counts an instance as STALLED only when neither a micro-batch nor that
-- work advanced for the stall timeout (tandem.supervisor.health).
ALTER TABLE liveness ADD COLUMN IF NOT EXISTS work_at timestamptz;
