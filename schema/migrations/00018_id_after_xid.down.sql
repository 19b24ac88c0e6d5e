-- The identity again, continuing the sequence, with its grants but the
-- USAGE 00018 gave every role.
DO $$
DECLARE
    next_id bigint;
    seq_acl aclitem[];
    r record;
BEGIN
    LOCK TABLE {{.Table}} IN ACCESS EXCLUSIVE MODE;
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO next_id FROM {{.Qualified "id_seq"}};
    SELECT relacl INTO seq_acl FROM pg_class WHERE oid = '{{.Qualified "id_seq"}}'::regclass;
    ALTER TABLE {{.Table}} ALTER COLUMN id DROP DEFAULT;
    DROP SEQUENCE {{.Qualified "id_seq"}};
    EXECUTE format('ALTER TABLE {{.Table}} ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)', next_id);
    FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM aclexplode(seq_acl) a
        WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = '{{.Table}}'::regclass)
          AND NOT (a.grantee = 0 AND a.privilege_type = 'USAGE') LOOP
        EXECUTE format('GRANT %s ON SEQUENCE %s TO %s%s', r.privilege_type, pg_get_serial_sequence('{{.Table}}', 'id'),
            CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END,
            CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
