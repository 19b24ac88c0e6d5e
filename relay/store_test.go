package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The headers column, whatever a producer put in it, decodes to a string
// map or a reason — never a panic, never a silent drop of a value.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `{"n":1}`, `[1]`, `null`, `{"a":{"b":"c"}}`, `{"a":null}`, `"x"`, `{"a":"\u0000"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		m, reason := decodeHeaders(raw)
		if reason == "" && m == nil {
			t.Fatalf("%q: neither headers nor a reason", raw)
		}
		if reason != "" && m != nil {
			t.Fatalf("%q: both headers and a reason", raw)
		}
	})
}

// insertKeyed writes n rows for each key, interleaved (k0 r0, k1 r0, ...,
// k0 r1, ...), and returns row id -> key.
func (f *fixture) insertKeyed(keys, n int) map[int64]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `INSERT INTO `+f.table.Ident()+` (topic, key, payload)
		SELECT 'orders.k', 'k' || (g % @keys::int), '\x00' FROM generate_series(0, @keys::int * @per_key::int - 1) g ORDER BY g RETURNING id, key`, pgx.NamedArgs{"keys": keys, "per_key": n})
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var k string
		rows.Scan(&id, &k)
		out[id] = k
	}
	return out
}
