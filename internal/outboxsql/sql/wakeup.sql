-- MaxID: the outbox's highest id, read by a relay taking the wake lock to
-- see whether rows committed since its last claim.
{{define "MaxID"}}SELECT coalesce(max(id), 0) FROM {{.Table}}{{end}}
