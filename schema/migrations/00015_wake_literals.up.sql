-- The wake-up of 00013 with its channel and lock key written into the body:
-- reading them from TG_ARGV was a quarter of what the trigger costs an insert.
-- No lock on the outbox; producers run the new body from their next insert.
CREATE OR REPLACE FUNCTION {{.Qualified "wake"}}() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared({{.WakeLock}}) THEN
        PERFORM pg_notify('{{.Channel}}', '');
    END IF;
    RETURN NULL;
END
$f$;
