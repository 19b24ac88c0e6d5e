package main

import (
	"encoding/json"
	"io"
)

// printJSON writes v as one indented JSON document: what every command's
// --json prints. Durations are float seconds in fields named *_seconds. It
// fails silently (exit 1): stdout is gone.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return &silentError{err}
	}
	return nil
}
