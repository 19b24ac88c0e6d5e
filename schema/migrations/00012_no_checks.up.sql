-- The outbox's two CHECKs (topic not empty, headers an object) cost every
-- producer's insert more than any index: Postgres parses them again for each
-- statement. The relay parks such rows instead, as it parks rows breaking the
-- other rules (docs/producers.md, "The rules a row must follow").
--
-- Dropping a constraint takes an ACCESS EXCLUSIVE lock, and producers queue
-- behind a request for it. So each try waits at most 200 ms for the lock,
-- then lets them through for a second, until the batches in flight end within a try.
DO $$
DECLARE
    outer_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR try IN 1..300 LOOP
        BEGIN
            ALTER TABLE {{.Table}}
                DROP CONSTRAINT IF EXISTS {{.Name}}_topic_check,
                DROP CONSTRAINT IF EXISTS {{.Name}}_headers_check;
            PERFORM set_config('lock_timeout', outer_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(1);
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the outbox {{.Name}} within 200 ms in 300 tries: a transaction kept it (a long producer transaction, or relay batches waiting for a broker); run relayd migrate again at a quieter moment';
END
$$;
