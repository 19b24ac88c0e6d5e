CREATE OR REPLACE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Qualified "notify"}}('{{.Channel}}');
