-- What `relayd backfill` moved from the legacy queue into JetStream, written
-- after JetStream's PubAck and before the RabbitMQ ack. A rerun after a crash
-- skips what is recorded here instead of relying on the stream's duplicate
-- window; `relayd verify` reads it too. Trimmed after RELAY_RETENTION.
CREATE TABLE {{.Qualified "backfilled"}} (
    message_id text        PRIMARY KEY,
    queue      text        NOT NULL,
    derived    boolean     NOT NULL DEFAULT false,
    moved_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Name}}_backfilled_moved_at ON {{.Qualified "backfilled"}} (moved_at);
