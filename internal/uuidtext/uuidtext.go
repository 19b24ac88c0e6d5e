// Package uuidtext recognises message ids that are UUIDs in their canonical
// text form (8-4-4-4-12 hex digits, either case), so that every package
// compares ids the same way: Postgres stores a uuid and returns it lower-case.
// uuid.Parse alone also takes the urn:, braced and undashed forms, which are
// not UUID message ids here.
package uuidtext

import (
	"strings"

	"github.com/google/uuid"
)

// Parse parses s if it is a UUID in canonical text form, either case.
func Parse(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.UUID{}, false
	}
	u, err := uuid.Parse(s)
	return u, err == nil
}

// Is reports whether s is a UUID in canonical text form, either case.
func Is(s string) bool {
	_, ok := Parse(s)
	return ok
}

// Lower returns s lower-cased: for a UUID (Is), the spelling Postgres gives
// it.
func Lower(s string) string { return strings.ToLower(s) }
