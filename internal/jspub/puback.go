package jspub

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// parseAck reads a PubAck: whether the stream had the message already
// (Duplicate), or why it did not store it. The PubAck of a stored message is
// read as it is when it has a form the server writes from its template
// (storedAck); anything else (an error, a domain, a field a later server
// adds) by encoding/json, which is costly on every PubAck.
func (p *Publisher) parseAck(m *nats.Msg) (dup bool, err error) {
	d := m.Data
	if len(d) == 0 && m.Header.Get("Status") == "503" {
		return false, nats.ErrNoResponders
	}
	if dup, ok := p.storedAck(d); ok {
		return dup, nil
	}
	var pa struct {
		Error     *jetstream.APIError `json:"error"`
		Stream    string              `json:"stream"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(d, &pa); err != nil {
		return false, fmt.Errorf("%w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if pa.Error != nil {
		return false, pa.Error
	}
	if pa.Stream == "" {
		return false, jetstream.ErrInvalidJSAck
	}
	return pa.Duplicate, nil
}

// storedAck reads d if it is the PubAck of a stored message in a form the
// server writes from its template: {"stream":NAME,"seq":N}, with
// ,"duplicate":true before the brace for a repeat (2.9 puts a space after
// the first comma and after the last colon; 2.10 and later not after the
// comma). It says whether the message is a repeat, and whether d is such a
// PubAck at all. A stream other than the publisher's (several routes' streams)
// is read when its name needs no escape.
func (p *Publisher) storedAck(d []byte) (dup, ok bool) {
	rest, ok := bytes.CutPrefix(d, p.ackStored)
	if !ok {
		if rest, ok = cutStream(d); !ok {
			return false, false
		}
	}
	if rest, ok = bytes.CutPrefix(bytes.TrimPrefix(rest, []byte(" ")), []byte(`"seq":`)); !ok {
		return false, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 {
		return false, false
	}
	switch string(rest[n:]) {
	case "}":
		return false, true
	case `,"duplicate": true}`, `,"duplicate":true}`:
		return true, true
	}
	return false, false
}

// cutStream cuts {"stream":"NAME", off d, NAME without a quote or escape.
func cutStream(d []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(d, []byte(`{"stream":"`))
	if !ok {
		return nil, false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, false
	}
	return bytes.CutPrefix(rest[end+1:], []byte(","))
}
