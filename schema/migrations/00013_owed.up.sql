-- The producers' table holds only what producers write: every relay column
-- and index costs each of their inserts (docs/performance.md, "Producers:
-- what an insert costs"). The outbox as it stands, its rows and their state,
-- becomes {{.Name}}_owed, where a batch moves a row it leaves owed to a
-- target; a new, empty outbox takes the producers' inserts
-- (docs/design.md, "Two tables").
--
-- Renaming and creating take an ACCESS EXCLUSIVE lock for milliseconds,
-- whatever the table's size; producers queue behind a request for it, so
-- each try waits at most 200 ms, then lets them through for a second.
DO $$
DECLARE
    outer_timeout text := current_setting('lock_timeout');
    old regclass;
    owner name;
    next_id bigint;
    seq_acl aclitem[];
    carried text;
    r record;
BEGIN
    old := to_regclass('{{.Table}}');
    -- What the rename would leave pointing at the relay's table: refuse, naming it.
    SELECT string_agg(what, ', ') INTO carried FROM (
        SELECT 'view ' || v.oid::regclass AS what FROM pg_depend d
            JOIN pg_rewrite w ON w.oid = d.objid JOIN pg_class v ON v.oid = w.ev_class
            WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = old AND v.oid <> old
        UNION SELECT 'foreign key ' || conname || ' of ' || conrelid::regclass FROM pg_constraint WHERE confrelid = old
        UNION SELECT 'policy ' || polname FROM pg_policy WHERE polrelid = old
        UNION SELECT 'publication ' || p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid WHERE pr.prrelid = old
        UNION SELECT 'trigger ' || tgname FROM pg_trigger WHERE tgrelid = old AND NOT tgisinternal AND tgname <> '{{.Name}}_notify'
        UNION SELECT 'rule ' || rulename FROM pg_rewrite WHERE ev_class = old
        -- A function with a SQL-standard body (BEGIN ATOMIC) is bound to the
        -- table, as a view is: a producer's would insert into {{.Name}}_owed.
        UNION SELECT 'function ' || d.objid::regprocedure FROM pg_depend d
            WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_class'::regclass AND d.refobjid = old
    ) x;
    IF carried IS NOT NULL THEN
        RAISE EXCEPTION 'the outbox {{.Name}} has %, which would follow it to {{.Name}}_owed: drop them, migrate, then create them on the new outbox', carried;
    END IF;

    PERFORM set_config('lock_timeout', '200ms', true);
    FOR try IN 1..300 LOOP
        BEGIN
            LOCK TABLE {{.Table}} IN ACCESS EXCLUSIVE MODE;
            -- No insert runs now: every id handed out is at most last_value.
            EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s',
                pg_get_serial_sequence('{{.Table}}', 'id')) INTO next_id;
            -- The role's name itself, not regrole's quoted spelling: %I quotes it.
            SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = old;
            -- The identity's sequence goes with DROP IDENTITY; its grants (for
            -- producers calling currval or lastval) go to the new one.
            SELECT relacl INTO seq_acl FROM pg_class WHERE oid = pg_get_serial_sequence('{{.Table}}', 'id')::regclass;

            ALTER TABLE {{.Table}} RENAME TO {{.Name}}_owed;
            ALTER TABLE {{.Qualified "owed"}} RENAME CONSTRAINT {{.Name}}_pkey TO {{.Name}}_owed_pkey;
            -- 00014 replaces the constraint: a producer may insert again the
            -- id of a row that has moved here (docs/producers.md, "Message ids").
            ALTER TABLE {{.Qualified "owed"}} RENAME CONSTRAINT {{.Name}}_message_id_key TO {{.Name}}_owed_message_id_key;
            ALTER TABLE {{.Qualified "owed"}} ALTER COLUMN id DROP IDENTITY;
            DROP TRIGGER {{.Name}}_notify ON {{.Qualified "owed"}};

            EXECUTE format($t$
                CREATE TABLE {{.Table}} (
                    id         bigint      GENERATED ALWAYS AS IDENTITY (START WITH %s) PRIMARY KEY,
                    message_id uuid        NOT NULL DEFAULT gen_random_uuid(),
                    topic      text        NOT NULL,
                    key        text        NULL,
                    headers    jsonb       NULL,
                    payload    bytea       NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now(),
                    CONSTRAINT {{.Name}}_message_id_key UNIQUE (message_id)
                )$t$, next_id);
            -- The claim's walks: keyed rows in id order; per key ("is an
            -- earlier row of this key still here?" in one probe), and the
            -- unkeyed rows (key NULL) in id order, past any keyed backlog.
            CREATE INDEX {{.Name}}_keyed ON {{.Table}} (id) WHERE key IS NOT NULL;
            CREATE INDEX {{.Name}}_key_order ON {{.Table}} (key, id);
            ALTER TABLE {{.Table}} SET (
                autovacuum_vacuum_scale_factor = 0.01,
                autovacuum_analyze_scale_factor = 0.02,
                autovacuum_vacuum_cost_delay = 0
            );

            -- The wake-up of 00007, its test in the function: a trigger's WHEN
            -- is parsed again for every statement.
            CREATE FUNCTION {{.Qualified "wake"}}() RETURNS trigger LANGUAGE plpgsql AS $f$
            BEGIN
                IF NOT pg_try_advisory_xact_lock_shared(TG_ARGV[1]::bigint) THEN
                    PERFORM pg_notify(TG_ARGV[0], '');
                END IF;
                RETURN NULL;
            END
            $f$;
            CREATE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
                FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified "wake"}}('{{.Channel}}', '{{.WakeLock}}');
            DROP FUNCTION {{.Qualified "notify"}}();

            -- The producers' grants and owner, table and column ones, carry over.
            IF owner <> current_user THEN
                EXECUTE format('ALTER TABLE {{.Table}} OWNER TO %I', owner);
            END IF;
            FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable
                FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = old AND a.grantee <> c.relowner LOOP
                EXECUTE format('GRANT %s ON {{.Table}} TO %s%s', r.privilege_type,
                    CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
                    CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
            FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable
                FROM aclexplode(seq_acl) a WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = old) LOOP
                EXECUTE format('GRANT %s ON SEQUENCE %s TO %s%s', r.privilege_type, pg_get_serial_sequence('{{.Table}}', 'id'),
                    CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
                    CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
            FOR r IN SELECT t.attname, a.grantee, a.privilege_type, a.is_grantable
                FROM pg_attribute t, aclexplode(t.attacl) a
                WHERE t.attrelid = old AND t.attacl IS NOT NULL
                  AND t.attname IN ('id', 'message_id', 'topic', 'key', 'headers', 'payload', 'created_at') LOOP
                EXECUTE format('GRANT %s (%I) ON {{.Table}} TO %s%s', r.privilege_type, r.attname,
                    CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
                    CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;

            PERFORM set_config('lock_timeout', outer_timeout, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(1);
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the outbox {{.Name}} within 200 ms in 300 tries: a transaction kept it (a long producer transaction, or relay batches waiting for a broker); run relayd migrate again at a quieter moment';
END
$$;
