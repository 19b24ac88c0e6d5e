package main

import (
	"encoding/json"
	"io"
)

// printJSON writes v as one indented JSON document: what every command's
// --json prints. Durations are float seconds in fields named *_seconds.
func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return exitFailure
	}
	return exitOK
}
