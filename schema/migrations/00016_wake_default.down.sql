-- The wake trigger of 00015, and created_at's plain default. The key and
-- channel stay those of the default, which running relays read.
DO $$
DECLARE
    outer_timeout text := current_setting('lock_timeout');
    dflt text;
    channel text := '{{.Channel}}';
    lock bigint := {{.WakeLock}};
BEGIN
    SELECT pg_get_expr(d.adbin, d.adrelid) INTO dflt FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = '{{.Table}}'::regclass AND a.attname = 'created_at';
    channel := coalesce(substring(dflt FROM '_wake\(''([^'']+)'''), channel);
    lock := coalesce(substring(dflt FROM 'pg_try_advisory_xact_lock_shared\(''?(-?[0-9]+)')::bigint, lock);

    EXECUTE format($f$CREATE FUNCTION {{.Qualified "wake"}}() RETURNS trigger LANGUAGE plpgsql AS $b$
        BEGIN
            IF NOT pg_try_advisory_xact_lock_shared(%s) THEN
                PERFORM pg_notify(%L, '');
            END IF;
            RETURN NULL;
        END
        $b$
    $f$, lock, channel);

    PERFORM set_config('lock_timeout', '200ms', true);
    FOR try IN 1..300 LOOP
        BEGIN
            EXECUTE format('CREATE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
                FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified "wake"}}(%L, %L)', channel, lock);
            ALTER TABLE {{.Table}} ALTER COLUMN created_at SET DEFAULT now();
            PERFORM set_config('lock_timeout', outer_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(1);
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the outbox {{.Name}} within 200 ms in 300 tries: a transaction kept it (a long producer transaction, or relay batches waiting for a broker); run relayd migrate again at a quieter moment';
END
$$;
DROP FUNCTION {{.Qualified "wake"}}(text);
