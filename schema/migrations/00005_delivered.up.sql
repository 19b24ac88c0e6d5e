-- Delivered rows leave the outbox: a row that reached every enabled target is
-- deleted in the same transaction that records its last confirm, and its id
-- is written here. Rewriting the whole row (payload and all) to mark it
-- delivered, and keeping it for the retention, cost Postgres about half of
-- the relay's work; a delete and a narrow insert cost a fraction of that,
-- and the outbox holds only what is still owed.
--
-- This table is the record of delivery that `relayd backfill` (skip what the
-- relay delivered) and `relayd verify` (is everything delivered in the
-- stream?) read. Rows are deleted RELAY_RETENTION after done_at. Rows marked
-- done in the outbox before this migration stay there until the retention
-- deletes them, and are read as before.
--
-- Keyed by the outbox row's id, which is never reused: the insert needs no
-- uniqueness check on message_id (a random uuid, the costly index to
-- maintain). message_id is unique in the outbox, but a producer may insert
-- an id again after its first row was delivered and left: both deliveries
-- are recorded.
CREATE TABLE {{.Qualified "delivered"}} (
    id                bigint      PRIMARY KEY,
    message_id        uuid        NOT NULL,
    amqp_delivered_at timestamptz NULL,
    nats_delivered_at timestamptz NULL,
    done_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Name}}_delivered_message_id ON {{.Qualified "delivered"}} (message_id);
CREATE INDEX {{.Name}}_delivered_done_at ON {{.Qualified "delivered"}} (done_at);
