-- Rows relayd marked done in the outbox itself, before migration 00005, move
-- to the delivered table, where every later finished row is recorded: the
-- done index (00011 drops it) then holds nothing, and costs every producer's
-- insert an index to open and a condition to test. One statement, so the
-- rows and their record move together; it takes the outbox's row locks only
-- (producers and claims go on), for as long as deleting those rows takes.
WITH moved AS (
    DELETE FROM {{.Table}} o WHERE done_at IS NOT NULL
    RETURNING o.id, o.message_id, o.amqp_delivered_at, o.nats_delivered_at,
        o.amqp_delivered_at IS NOT NULL OR o.amqp_attempts > 0 OR o.amqp_last_error IS NOT NULL AS amqp_sent,
        o.done_at
)
INSERT INTO {{.Qualified "delivered"}} (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
SELECT id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at FROM moved;
