-- +relayd no-transaction
-- Before 00014 a message id is in the two tables once; producers may have
-- inserted one again since. Say so, rather than the unique index's bare error.
-- +goose StatementBegin
DO $$
DECLARE
    twice bigint;
    example uuid;
BEGIN
    SELECT count(*), (array_agg(message_id))[1] INTO twice, example FROM (
        SELECT message_id FROM (SELECT message_id FROM {{.Table}} UNION ALL SELECT message_id FROM {{.Qualified "owed"}}) m
        GROUP BY message_id HAVING count(*) > 1) d;
    IF twice > 0 THEN
        RAISE EXCEPTION 'message ids are in the outbox {{.Name}} and {{.Name}}_owed more than once (% of them, % for one): a producer inserted them again; let the relay deliver the copies, or delete them, then migrate down again', twice, example;
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE {{.Qualified "owed"}} ADD CONSTRAINT {{.Name}}_owed_message_id_key UNIQUE (message_id);
DROP INDEX CONCURRENTLY IF EXISTS {{.Qualified "owed_message_id"}};
