-- The relay's table becomes the outbox again, with the rows of the
-- producers' table moved into it (owed to every target), holding both locked.
LOCK TABLE {{.Table}}, {{.Qualified "owed"}} IN ACCESS EXCLUSIVE MODE;
INSERT INTO {{.Qualified "owed"}} (id, message_id, topic, key, headers, payload, created_at)
SELECT id, message_id, topic, key, headers, payload, created_at FROM {{.Table}};
DO $$
DECLARE
    next_id bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s',
        pg_get_serial_sequence('{{.Table}}', 'id')) INTO next_id;
    DROP TABLE {{.Table}};
    DROP FUNCTION {{.Qualified "wake"}}();
    ALTER TABLE {{.Qualified "owed"}} RENAME TO {{.Name}};
    ALTER TABLE {{.Table}} RENAME CONSTRAINT {{.Name}}_owed_pkey TO {{.Name}}_pkey;
    ALTER TABLE {{.Table}} RENAME CONSTRAINT {{.Name}}_owed_message_id_key TO {{.Name}}_message_id_key;
    EXECUTE format('ALTER TABLE {{.Table}} ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)', next_id);
END
$$;
CREATE FUNCTION {{.Qualified "notify"}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
CREATE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared({{.WakeLock}}))
    EXECUTE FUNCTION {{.Qualified "notify"}}('{{.Channel}}', '{{.WakeLock}}');
