-- Producers notify only while a relay waits for rows. A waiting relay holds
-- the table's wake lock (a session advisory lock, gone with its session); a
-- producer's statement notifies only when it cannot take that lock shared.
-- A NOTIFY takes a cluster-wide lock at commit that serialises every
-- notifying transaction, so under load, when no relay waits, no producer
-- queues one. The shared lock is held to the producer's commit, so a relay
-- cannot start waiting while a row it would not be told of is uncommitted.
-- See docs/design.md, "Waking the relay".
--
-- CREATE OR REPLACE TRIGGER (Postgres 14+) takes a SHARE ROW EXCLUSIVE lock
-- on the table for milliseconds, whatever its size: writes wait that long
-- (and behind any writer already holding a conflicting lock), reads do not.
CREATE OR REPLACE TRIGGER {{.Name}}_notify AFTER INSERT ON {{.Table}}
    FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared({{.WakeLock}}))
    EXECUTE FUNCTION {{.Qualified "notify"}}('{{.Channel}}', '{{.WakeLock}}');
