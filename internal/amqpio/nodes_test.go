package amqpio

import (
	"errors"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestSplitURLs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", []string{"amqp://guest:guest@127.0.0.1:5672/"}},
		{"amqp://a:5672/,amqp://b:5672/", []string{"amqp://a:5672/", "amqp://b:5672/"}},
		{" amqp://a/ , amqps://b/ ,amqp://c/", []string{"amqp://a/", "amqps://b/", "amqp://c/"}},
		{"amqp://a/,", []string{"amqp://a/"}},
		{"amqp://a/, ,amqp://b/", []string{"amqp://a/", "amqp://b/"}},
		{"amqp://a/,,", []string{"amqp://a/"}},
		{"", nil},
		{" , ", nil},
		// A comma in a password is the password's: no URL follows it.
		{"amqp://relay:Pa55,word@rabbit:5672/", []string{"amqp://relay:Pa55,word@rabbit:5672/"}},
		{"amqp://u:p,w@a/,amqp://u:p,w@b/", []string{"amqp://u:p,w@a/", "amqp://u:p,w@b/"}},
		{"amqp://u:p,,w@a/", []string{"amqp://u:p,,w@a/"}},
		{"amqp://u:p, amqp://x@a/", []string{"amqp://u:p", "amqp://x@a/"}}, // validation refuses the first: "a comma in a password must be %2C"
		// Without a scheme it is no new URL (nats.go's list takes one; amqp091-go does not).
		{"amqp://a/,b:5672", []string{"amqp://a/,b:5672"}},
	} {
		if got := SplitURLs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("SplitURLs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The nodes each Dial tries: in order at first, then from the node after
// the one last connected to.
func TestNodesDialOrder(t *testing.T) {
	const list = "amqp://u:pw@a:5672/,amqp://u:pw@b:5673/,amqp://u:pw@c:5674/"
	type dial struct {
		up    string // the hosts that answer
		tried string // the hosts tried, in order
		got   string // the node connected to ("" none)
	}
	for _, tc := range []struct {
		name  string
		dials []dial
	}{
		{"first answers", []dial{{"abc", "a", "a:5672"}}},
		{"first down", []dial{{"bc", "ab", "b:5673"}}},
		{"all down, then the next dial starts over in order", []dial{{"", "abc", ""}, {"c", "abc", "c:5674"}}},
		{"reconnect goes to the next node", []dial{{"abc", "a", "a:5672"}, {"abc", "b", "b:5673"}, {"abc", "c", "c:5674"}, {"abc", "a", "a:5672"}}},
		{"the lost node is tried last", []dial{{"abc", "a", "a:5672"}, {"a", "bca", "a:5672"}}},
		{"after a failed round, from the same node", []dial{{"b", "ab", "b:5673"}, {"", "cab", ""}, {"ab", "ca", "a:5672"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := NewNodes(list)
			var up, tried string
			n.dial = func(url string, _ amqp.Config) (*amqp.Connection, error) {
				host := url[strings.Index(url, "@")+1:][:1]
				tried += host
				if !strings.Contains(up, host) {
					return nil, errors.New("dial tcp " + host + ": connection refused")
				}
				return &amqp.Connection{}, nil
			}
			for i, d := range tc.dials {
				up, tried = d.up, ""
				_, addr, err := n.Dial(DialOptions{})
				if tried != d.tried || addr != d.got || (err == nil) != (d.got != "") {
					t.Errorf("dial %d with %q up: tried %q, connected to %q (err %v); want tried %q, connected to %q",
						i+1, d.up, tried, addr, err, d.tried, d.got)
				}
			}
		})
	}
}

// When every node fails, the error says which node gave which error, on
// one line, without the credentials; a single node's error is its own.
func TestNodesDialErrors(t *testing.T) {
	refused := errors.New("connection refused")
	n := NewNodes("amqp://u:s3cret@a:5672/,amqps://u:s3cret@b/")
	n.dial = func(string, amqp.Config) (*amqp.Connection, error) { return nil, refused }
	_, _, err := n.Dial(DialOptions{})
	if !errors.Is(err, refused) {
		t.Fatalf("err = %v, want it to wrap each node's", err)
	}
	want := "node 1 of 2 (a:5672): connection refused; node 2 of 2 (b:5671): connection refused"
	if err.Error() != want {
		t.Errorf("err = %q, want %q", err, want)
	}
	one := NewNodes("amqp://u:s3cret@a:5672/")
	one.dial = n.dial
	if _, _, err := one.Dial(DialOptions{}); err != refused {
		t.Errorf("one node: err = %v, want its own", err)
	}
	if _, _, err := NewNodes(" , ").Dial(DialOptions{}); err == nil {
		t.Error("an empty list dialed")
	}
}
