-- The wake-up moves from the insert trigger into created_at's default: the
-- same test, without the call of a PL/pgSQL trigger, which was two thirds of
-- what the trigger cost each insert (docs/performance.md, "Producers: what
-- an insert costs"). The default takes the wake lock shared, held to the
-- producer's commit, and calls {{.Name}}_wake only when a relay holds it.
-- A producer that writes created_at itself is found by the next poll.
CREATE FUNCTION {{.Qualified "wake"}}(channel text) RETURNS timestamptz LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_notify(channel, '');
    RETURN now();
END
$f$;
-- Every insert checks its right to the function, not only those that call it.
GRANT EXECUTE ON FUNCTION {{.Qualified "wake"}}(text) TO PUBLIC;

-- The key and channel stay those of the trigger's arguments, which running
-- relays read: an earlier migration may have been given another spelling of
-- the table's name. Setting a default takes an ACCESS EXCLUSIVE lock for
-- milliseconds, whatever the table's size; producers queue behind a request
-- for it, so each try waits at most 200 ms, then lets them through for a
-- second (as 00012).
DO $$
DECLARE
    outer_timeout text := current_setting('lock_timeout');
    args bytea;
    channel text := '{{.Channel}}';
    lock bigint := {{.WakeLock}};
BEGIN
    SELECT tgargs INTO args FROM pg_trigger WHERE tgrelid = '{{.Table}}'::regclass AND tgname = '{{.Name}}_notify';
    IF args IS NOT NULL AND position('\x00'::bytea IN args) > 1 THEN
        channel := convert_from(substring(args FOR position('\x00'::bytea IN args) - 1), 'UTF8');
        args := substring(args FROM position('\x00'::bytea IN args) + 1);
        IF position('\x00'::bytea IN args) > 1 THEN
            lock := convert_from(substring(args FOR position('\x00'::bytea IN args) - 1), 'UTF8')::bigint;
        END IF;
    END IF;

    PERFORM set_config('lock_timeout', '200ms', true);
    FOR try IN 1..300 LOOP
        BEGIN
            EXECUTE format($a$ALTER TABLE {{.Table}} ALTER COLUMN created_at SET DEFAULT
                CASE WHEN pg_try_advisory_xact_lock_shared(%s) THEN now()
                ELSE {{.Qualified "wake"}}(%L::text) END$a$, lock, channel);
            DROP TRIGGER IF EXISTS {{.Name}}_notify ON {{.Table}};
            PERFORM set_config('lock_timeout', outer_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(1);
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the outbox {{.Name}} within 200 ms in 300 tries: a transaction kept it (a long producer transaction, or relay batches waiting for a broker); run relayd migrate again at a quieter moment';
END
$$;
DROP FUNCTION IF EXISTS {{.Qualified "wake"}}();
