package outbox

import "github.com/relayd/relayd/internal/uuidtext"

// parseUUID parses an id in the canonical UUID text form, in either case:
// the form the producer API documents for Message.ID.
func parseUUID(s string) ([16]byte, bool) {
	return uuidtext.Parse(s)
}
