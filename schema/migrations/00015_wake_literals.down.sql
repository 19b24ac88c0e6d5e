-- The wake-up of 00013, reading its channel and lock key from the trigger's
-- arguments.
CREATE OR REPLACE FUNCTION {{.Qualified "wake"}}() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(TG_ARGV[1]::bigint) THEN
        PERFORM pg_notify(TG_ARGV[0], '');
    END IF;
    RETURN NULL;
END
$f$;
