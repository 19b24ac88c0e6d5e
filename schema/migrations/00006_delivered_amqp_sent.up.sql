-- The backfill looks ids up in <table>_delivered to skip legacy-queue
-- messages that JetStream already has from the relay. Only a row the relay
-- sent to RabbitMQ can be in that queue, so only such rows need to be found
-- by message id: amqp_sent says the relay published the row to RabbitMQ, or
-- may have (delivered, attempted, or waiting for a confirm that never came).
-- The message_id index now holds just the rows the backfill can ask about.
--
-- In the last phase of the move (RELAY_TARGETS=nats) and in the first (amqp
-- only) no delivered row enters it: a random uuid is the costly index to
-- maintain (one random leaf page per row; the delivered record cost Postgres
-- a third of the relay's work in the nats-only benchmark, about half of it
-- this index), and over a day's retention it outgrows the cache.
--
-- Rows recorded before this migration, or written by an older relayd, get
-- the default, true: the backfill finds them as before. Rebuilding the
-- index holds <table>_delivered locked while it runs (seconds per million
-- rows kept): relays wait to record their batches, producers' inserts into
-- the outbox do not wait.
ALTER TABLE {{.Qualified "delivered"}} ADD COLUMN amqp_sent boolean NOT NULL DEFAULT true;
DROP INDEX {{.Qualified "delivered_message_id"}};
CREATE INDEX {{.Name}}_delivered_message_id ON {{.Qualified "delivered"}} (message_id)
    WHERE amqp_sent AND nats_delivered_at IS NOT NULL;
