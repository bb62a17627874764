-- Issue 26: an events output published to a NATS stream (outputs.<name>.stream), exactly once.
--
-- The stream itself says how far publishing got: each message carries its event's position in
-- output_events' (xid, event_id) order. This row repeats the last position a relay saw stored, for the
-- one case the stream cannot say it: its retention dropped that last message. It only moves forward.
CREATE TABLE IF NOT EXISTS output_streams (
    plan       text        NOT NULL,
    output     text        NOT NULL,
    stream     text        NOT NULL,
    stream_seq bigint      NOT NULL,
    xid        bigint      NOT NULL,
    event_id   text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plan, output)
);
