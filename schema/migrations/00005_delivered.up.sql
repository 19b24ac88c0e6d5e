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
-- Two indexes, each insert cheap to maintain: the primary key in time order
-- (appends; the retention deletes from its start), and message_id for the
-- backfill's lookups, without a uniqueness check (a random uuid is the
-- costly index to maintain). message_id is unique in the outbox, but a
-- producer may insert an id again after its first row was delivered and
-- left: both deliveries are recorded. id is the outbox row's id.
CREATE TABLE {{.Qualified "delivered"}} (
    done_at           timestamptz NOT NULL DEFAULT now(),
    id                bigint      NOT NULL,
    message_id        uuid        NOT NULL,
    amqp_delivered_at timestamptz NULL,
    nats_delivered_at timestamptz NULL,
    PRIMARY KEY (done_at, id)
);
CREATE INDEX {{.Name}}_delivered_message_id ON {{.Qualified "delivered"}} (message_id);
