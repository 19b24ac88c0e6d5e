// Package uuidtext recognises UUIDs in their canonical text form, the form
// message ids take in the outbox, so that every package compares them the
// same way (Postgres stores and returns them in lower case).
package uuidtext

// Is reports whether s is a UUID in canonical 8-4-4-4-12 hex form, either case.
func Is(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// Lower returns s with ASCII upper-case letters lowered: the spelling
// Postgres gives a uuid.
func Lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
