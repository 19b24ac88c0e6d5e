-- The session that wrote a relay's row: while it holds its presence lock
-- (the instances table's oid and this pid), the relay is running, with no
-- row rewritten to say so (docs/design.md, "Following the phase"). NULL: a
-- relay of an earlier version, running while its seen_at is recent.
ALTER TABLE {{.Qualified "instances"}} ADD COLUMN pid integer NULL;
