package cutover

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The instances condition holds only when every address answers /version
// with 200 and the same version: instances that all answer the same error
// page (a relayd too old for /version, a proxy's 503) do not agree on
// anything.
func TestVersionsNeedA200FromEachInstance(t *testing.T) {
	serve := func(code int, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			w.Write([]byte(body)) //nolint:errcheck // test server
		}))
		t.Cleanup(s.Close)
		return strings.TrimPrefix(s.URL, "http://")
	}
	same, other := serve(200, "v1.2.0\n"), serve(200, "v1.3.0\n")
	notFound := []string{serve(404, "404 page not found\n"), serve(404, "404 page not found\n")}
	for _, tc := range []struct {
		name  string
		addrs []string
		ok    bool
	}{
		{"same version", []string{same, serve(200, "v1.2.0")}, true},
		{"two versions", []string{same, other}, false},
		{"the same 404 page", notFound, false},
		{"one 404", []string{same, notFound[0]}, false},
		{"empty 200s", []string{serve(200, ""), serve(200, "")}, false},
	} {
		cs := versions(context.Background(), tc.addrs)
		if len(cs) != 1 || cs[0].OK != tc.ok {
			t.Errorf("%s: %+v, want OK=%v", tc.name, cs, tc.ok)
		}
	}
}
