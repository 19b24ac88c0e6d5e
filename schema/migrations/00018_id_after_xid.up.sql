-- A row's id is taken once its transaction has a transaction id
-- (pg_current_xact_id() before nextval); an identity takes it before. So
-- every row a claim cannot see below the newest it sees belongs to a
-- transaction its snapshot shows running, and the claim floor moves on past
-- a long transaction instead of waiting for it (docs/design.md, "The claim
-- floor"). The sequence continues the identity's and keeps its grants;
-- every role may use it, as INSERT now needs it. Dropping the identity and
-- setting the default take an ACCESS EXCLUSIVE lock for milliseconds, with
-- the tries of 00012.
DO $$
DECLARE
    outer_timeout text := current_setting('lock_timeout');
    old_seq regclass;
    next_id bigint;
    seq_acl aclitem[];
    owner name;
    r record;
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR try IN 1..300 LOOP
        BEGIN
            LOCK TABLE {{.Table}} IN ACCESS EXCLUSIVE MODE;
            -- No insert runs now: every id handed out is below next_id.
            old_seq := pg_get_serial_sequence('{{.Table}}', 'id')::regclass;
            EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s', old_seq) INTO next_id;
            SELECT relacl INTO seq_acl FROM pg_class WHERE oid = old_seq;
            SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = '{{.Table}}'::regclass;

            ALTER TABLE {{.Table}} ALTER COLUMN id DROP IDENTITY;
            EXECUTE format('CREATE SEQUENCE {{.Qualified "id_seq"}} START WITH %s', next_id);
            IF owner <> current_user THEN
                EXECUTE format('ALTER SEQUENCE {{.Qualified "id_seq"}} OWNER TO %I', owner);
            END IF;
            ALTER SEQUENCE {{.Qualified "id_seq"}} OWNED BY {{.Table}}.id;
            ALTER TABLE {{.Table}} ALTER COLUMN id SET DEFAULT
                CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval('{{.Qualified "id_seq"}}') END;
            GRANT USAGE ON SEQUENCE {{.Qualified "id_seq"}} TO PUBLIC;
            FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM aclexplode(seq_acl) a
                WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = '{{.Table}}'::regclass) LOOP
                EXECUTE format('GRANT %s ON SEQUENCE {{.Qualified "id_seq"}} TO %s%s', r.privilege_type,
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
