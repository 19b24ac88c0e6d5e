-- MaxID: the outbox's highest id above $1 (the relay's last claim's top),
-- 0 if none, read by a relay taking the wake lock to see whether rows
-- committed since its last claim. The bound stops the backward walk there:
-- while a long transaction keeps the rows deleted since on disk, a walk to
-- the newest live row would step over all of them.
{{define "MaxID"}}SELECT coalesce(max(id), 0) FROM {{.Table}} WHERE id > $1::bigint{{end}}
