package msgid

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The vectors are shared with the implementations in other languages
// (docs/message-ids.md): the Go inbox's package owns the file.
const vectorsFile = "../../inbox/testdata/derived-ids.json"

var update = flag.Bool("update", false, "write the ids DeriveID gives into "+vectorsFile+" (fills new vectors' ids; logs each changed one)")

// vector is one entry of the vectors file; its format is described in
// docs/message-ids.md, "Test vectors".
type vector struct {
	Name          string          `json:"name"`
	RoutingKey    string          `json:"routing_key"`
	Timestamp     string          `json:"timestamp"`
	Type          string          `json:"type"`
	CorrelationID string          `json:"correlation_id"`
	ContentType   string          `json:"content_type"`
	Headers       json.RawMessage `json:"headers"` // raw, so a rewrite keeps the names' order
	BodyBase64    string          `json:"body_base64"`
	ID            string          `json:"id"`
}

// typed is a header value with the AMQP field type it arrives as.
type typed struct {
	Type  string          `json:"type"`
	AMQP  string          `json:"amqp,omitempty"` // int and float: the field type octet
	Value json.RawMessage `json:"value"`
}

func TestVectors(t *testing.T) {
	b, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := strict(b, &vs); err != nil {
		t.Fatalf("%s: %v", vectorsFile, err)
	}
	names, seen := map[string]bool{}, map[string]bool{}
	changed := false
	for i := range vs {
		v := &vs[i]
		if names[v.Name] {
			t.Errorf("two vectors named %q", v.Name)
		}
		names[v.Name] = true
		d, err := v.delivery(seen)
		if err != nil {
			t.Errorf("vector %q: %v", v.Name, err)
			continue
		}
		got := DeriveID(d)
		switch {
		case got == v.ID:
		case *update:
			if v.ID != "" {
				t.Logf("vector %q: id changed from %s to %s", v.Name, v.ID, got)
			}
			v.ID, changed = got, true
		case v.ID == "":
			t.Errorf("vector %q has no id: run go test ./internal/msgid -run TestVectors -update", v.Name)
		default:
			t.Errorf("vector %q: DeriveID = %s, the file says %s", v.Name, got, v.ID)
		}
	}
	// The pairs that show what does not count.
	ids := map[string]string{}
	for _, v := range vs {
		ids[v.Name] = v.ID
	}
	for a, b := range map[string]string{
		"timestamp: another zone, hashed in UTC (same id as timestamp only)": "timestamp only",
		"header order: the same names given in another order (same id)":      "header order: names sorted by their UTF-8 bytes",
		"broker headers: left out (same id as without them)":                 "broker headers: the message without them",
	} {
		if ids[a] == "" || ids[a] != ids[b] {
			t.Errorf("vectors %q and %q: ids %q and %q, want one id", a, b, ids[a], ids[b])
		}
	}
	// Every kind of input is pinned, so no implementation is left guessing.
	for _, want := range []string{"string", "bytes", "int", "float", "bool", "timestamp", "null", "table", "array", "decimal",
		"int:b", "int:B", "int:s", "int:u", "int:I", "int:i", "int:l", "float:f", "float:d"} {
		if !seen["type "+want] {
			t.Errorf("no vector has a header of type %s", want)
		}
	}
	for _, h := range BrokerHeaders() {
		if !seen["header "+h] {
			t.Errorf("no vector has the broker header %s", h)
		}
	}
	if changed && !t.Failed() {
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(vs); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsFile, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// delivery is the amqp.Delivery amqp091-go decodes from v's message; it
// notes in seen the header types and names it meets.
func (v *vector) delivery(seen map[string]bool) (amqp.Delivery, error) {
	body, err := base64.StdEncoding.DecodeString(v.BodyBase64)
	if err != nil {
		return amqp.Delivery{}, fmt.Errorf("body_base64: %w", err)
	}
	d := amqp.Delivery{RoutingKey: v.RoutingKey, Type: v.Type, CorrelationId: v.CorrelationID, ContentType: v.ContentType, Body: body}
	if v.Timestamp != "" {
		if d.Timestamp, err = time.Parse(time.RFC3339Nano, v.Timestamp); err != nil {
			return d, fmt.Errorf("timestamp: %w", err)
		}
	}
	var hs map[string]typed
	if err := strict(v.Headers, &hs); err != nil || hs == nil {
		return d, fmt.Errorf("headers: want an object: %v", err)
	}
	if len(hs) > 0 {
		d.Headers = make(amqp.Table, len(hs))
	}
	for k, tv := range hs {
		seen["header "+k] = true
		seen["type "+tv.Type] = true
		seen["type "+tv.Type+":"+tv.AMQP] = true
		if d.Headers[k], err = tv.decode(); err != nil {
			return d, fmt.Errorf("header %q: %w", k, err)
		}
	}
	return d, nil
}

// decode gives the Go value amqp091-go decodes the field to (read.go,
// readField).
func (tv typed) decode() (any, error) {
	if (tv.AMQP != "") != (tv.Type == "int" || tv.Type == "float") {
		return nil, fmt.Errorf("type %s: amqp %q: int and float name their field type, the others not", tv.Type, tv.AMQP)
	}
	switch tv.Type {
	case "string":
		var s string
		return s, strict(tv.Value, &s)
	case "bytes": // 'x'
		var s string
		if err := strict(tv.Value, &s); err != nil {
			return nil, err
		}
		return base64.StdEncoding.DecodeString(s)
	case "int":
		var s string // decimal text: JSON numbers lose int64s beyond 2^53 in JavaScript
		if err := strict(tv.Value, &s); err != nil {
			return nil, err
		}
		return decodeInt(tv.AMQP, s)
	case "float":
		var f float64
		var s string
		if strict(tv.Value, &s) == nil {
			switch s { // not JSON numbers
			case "NaN":
				f = math.NaN()
			case "+Inf":
				f = math.Inf(1)
			case "-Inf":
				f = math.Inf(-1)
			default:
				return nil, fmt.Errorf("float %q: want a number, NaN, +Inf or -Inf", s)
			}
		} else if err := strict(tv.Value, &f); err != nil {
			return nil, err
		}
		switch tv.AMQP {
		case "f":
			return float32(f), nil
		case "d":
			return f, nil
		}
		return nil, fmt.Errorf("float: amqp %q: want f or d", tv.AMQP)
	case "bool": // 't'
		var b bool
		return b, strict(tv.Value, &b)
	case "timestamp": // 'T': whole seconds
		var s string
		if err := strict(tv.Value, &s); err != nil {
			return nil, err
		}
		ts, err := time.Parse(time.RFC3339, s)
		if err == nil && ts.Nanosecond() != 0 {
			err = fmt.Errorf("timestamp %s: AMQP carries whole seconds", s)
		}
		// amqp091-go gives time.Unix(s, 0), in the local zone: in UTC here,
		// so the vectors do not depend on the machine's (see the docs).
		return ts.UTC(), err
	case "null": // 'V'
		if string(tv.Value) != "null" {
			return nil, fmt.Errorf("null: value %s", tv.Value)
		}
		return nil, nil
	case "decimal": // 'D'
		var dec struct {
			Scale uint8 `json:"scale"`
			Value int32 `json:"value"`
		}
		err := strict(tv.Value, &dec)
		return amqp.Decimal{Scale: dec.Scale, Value: dec.Value}, err
	case "table": // 'F': never nil, empty or not
		var m map[string]typed
		if err := strict(tv.Value, &m); err != nil || m == nil {
			return nil, fmt.Errorf("table: want an object: %v", err)
		}
		t := amqp.Table{}
		for k, e := range m {
			var err error
			if t[k], err = e.decode(); err != nil {
				return nil, fmt.Errorf("%q: %w", k, err)
			}
		}
		return t, nil
	case "array": // 'A': nil when empty
		var es []typed
		if err := strict(tv.Value, &es); err != nil || es == nil {
			return nil, fmt.Errorf("array: want an array: %v", err)
		}
		var a []any
		for i, e := range es {
			x, err := e.decode()
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			a = append(a, x)
		}
		return a, nil
	}
	return nil, fmt.Errorf("unknown type %q", tv.Type)
}

// decodeInt gives the Go type amqp091-go decodes each integer field to.
func decodeInt(field, s string) (any, error) {
	bits := map[string]int{"b": 8, "B": 8, "s": 16, "u": 16, "I": 32, "i": 32, "l": 64}[field]
	if bits == 0 {
		return nil, fmt.Errorf("int: amqp %q: want one of b B s u I i l", field)
	}
	if field == "B" || field == "u" || field == "i" {
		n, err := strconv.ParseUint(s, 10, bits)
		return map[string]any{"B": uint8(n), "u": uint16(n), "i": uint32(n)}[field], err
	}
	n, err := strconv.ParseInt(s, 10, bits)
	return map[string]any{"b": int8(n), "s": int16(n), "I": int32(n), "l": n}[field], err
}

// strict unmarshals b into v, refusing fields v does not have.
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// The loader gives amqp091-go's types: a changed mapping would pin other
// ids than a real delivery gets.
func TestVectorTypes(t *testing.T) {
	for _, tc := range []struct {
		json string
		want any
	}{
		{`{"type":"int","amqp":"b","value":"-1"}`, int8(-1)},
		{`{"type":"int","amqp":"B","value":"255"}`, byte(255)},
		{`{"type":"int","amqp":"s","value":"-1"}`, int16(-1)},
		{`{"type":"int","amqp":"u","value":"65535"}`, uint16(65535)},
		{`{"type":"int","amqp":"I","value":"-1"}`, int32(-1)},
		{`{"type":"int","amqp":"i","value":"4294967295"}`, uint32(4294967295)},
		{`{"type":"int","amqp":"l","value":"-1"}`, int64(-1)},
		{`{"type":"float","amqp":"f","value":1.5}`, float32(1.5)},
		{`{"type":"float","amqp":"d","value":1.5}`, 1.5},
		{`{"type":"array","value":[]}`, []any(nil)},
		{`{"type":"table","value":{}}`, amqp.Table{}},
		{`{"type":"decimal","value":{"scale":2,"value":-5}}`, amqp.Decimal{Scale: 2, Value: -5}},
	} {
		var tv typed
		if err := strict([]byte(tc.json), &tv); err != nil {
			t.Fatal(err)
		}
		got, err := tv.decode()
		if err != nil || fmt.Sprintf("%T %#v", got, got) != fmt.Sprintf("%T %#v", tc.want, tc.want) {
			t.Errorf("%s: got %T %#v, %v; want %T %#v", tc.json, got, got, err, tc.want, tc.want)
		}
	}
	for _, bad := range []string{
		`{"type":"int","amqp":"b","value":"128"}`,
		`{"type":"int","value":"1"}`,
		`{"type":"int","amqp":"l","value":1}`,
		`{"type":"string","amqp":"S","value":"x"}`,
		`{"type":"timestamp","value":"2024-01-01T00:00:00.5Z"}`,
		`{"type":"uuid","value":"x"}`,
	} {
		var tv typed
		if err := strict([]byte(bad), &tv); err != nil {
			t.Fatal(err)
		}
		if _, err := tv.decode(); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
