package outbox

import "github.com/google/uuid"

// newUUID and formatUUID are what the batch uses, for the tests.
func newUUID() [16]byte { return uuid.New() }

func formatUUID(u [16]byte) string { return uuid.UUID(u).String() }
