-- The creation time JetStream gave the stream a replay run reads: a rerun
-- resumes only on that stream, not on one re-created under its name, whose
-- sequences are other messages (a restore from a backup keeps the time).
-- NULL for runs recorded before it.
ALTER TABLE {{.Qualified "replay"}} ADD COLUMN stream_created timestamptz NULL;
