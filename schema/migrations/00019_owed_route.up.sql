-- Where a row left owed to a target was published, or is to be: its route
-- as the relay that first took it resolved it (docs/routes.md). Its retries,
-- by any relay, go the same way, whatever routes file that relay reads: no
-- row goes to one broker under one route and to the other under another.
-- NULL for rows not yet routed (moved here before this migration, or by a
-- late confirm): the next relay to publish one records its route.
ALTER TABLE {{.Qualified "owed"}}
    ADD COLUMN amqp_exchange text NULL,
    ADD COLUMN amqp_routing_key text NULL,
    ADD COLUMN nats_subject text NULL,
    ADD COLUMN nats_stream text NULL;
