package route

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// file is a routes file as written (docs/routes.md).
type file struct {
	Routes []fileRoute `json:"routes"`
}

type fileRoute struct {
	Name    string            `json:"name"`
	Topic   string            `json:"topic"`
	Headers map[string]string `json:"headers"`
	AMQP    *struct {
		Exchange   *string `json:"exchange"`
		RoutingKey *string `json:"routing_key"`
	} `json:"amqp"`
	NATS *struct {
		Subject *string `json:"subject"`
		Stream  string  `json:"stream"`
	} `json:"nats"`
}

// Load reads the routes file at path (YAML or JSON); its errors name the
// file, and the route and field at fault.
func Load(path string, d Defaults) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data, d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse builds a table from a routes file's contents. Fields it does not
// know are errors: a misspelt one would route silently elsewhere.
func Parse(data []byte, d Defaults) (*Table, error) {
	var f file
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("not a routes file: %w", err)
	}
	t := &Table{def: d}
	names := map[string]bool{}
	for i, fr := range f.Routes {
		r, err := parseRoute(fr, i, d)
		if err != nil {
			return nil, fmt.Errorf("routes[%d]%s: %w", i, nameSuffix(fr.Name), err)
		}
		if names[r.Name] {
			return nil, fmt.Errorf("routes[%d]: the name %q is taken by an earlier route", i, r.Name)
		}
		names[r.Name] = true
		t.routes = append(t.routes, r)
	}
	return t, nil
}

func nameSuffix(name string) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf(" (%s)", name)
}

func parseRoute(fr fileRoute, i int, d Defaults) (*Route, error) {
	r := &Route{Name: fr.Name, headers: fr.Headers}
	if r.Name == "" {
		r.Name = fmt.Sprintf("routes[%d]", i)
	}
	if fr.Topic == "" && len(fr.Headers) == 0 {
		return nil, errors.New("matches every row: give it a topic pattern or headers (the default route takes what no route matches)")
	}
	var err error
	if r.topic, err = parsePattern(fr.Topic); err != nil {
		return nil, fmt.Errorf("topic: %w", err)
	}
	n := r.topic.wildcards()
	exchange, key := d.Exchange, "{topic}"
	if a := fr.AMQP; a != nil {
		if a.Exchange != nil {
			exchange = *a.Exchange
		}
		if a.RoutingKey != nil {
			key = *a.RoutingKey
		}
	}
	subject, stream := d.SubjectPrefix+"{topic}", d.Stream
	if nt := fr.NATS; nt != nil {
		if nt.Subject != nil {
			subject = *nt.Subject
		}
		if nt.Stream != "" {
			stream = nt.Stream
		}
	}
	if r.exchange, err = parseTemplate(exchange, n); err != nil {
		return nil, fmt.Errorf("amqp.exchange %q: %w", exchange, err)
	}
	if r.routingKey, err = parseTemplate(key, n); err != nil {
		return nil, fmt.Errorf("amqp.routing_key %q: %w", key, err)
	}
	if exchange == "" && key == "" {
		return nil, errors.New("amqp: the default exchange (\"\") routes by routing_key to the queue of that name: give routing_key")
	}
	if len(exchange) > 255 {
		return nil, fmt.Errorf("amqp.exchange is %d bytes: AMQP takes at most 255", len(exchange))
	}
	if r.subject, err = parseTemplate(subject, n); err != nil {
		return nil, fmt.Errorf("nats.subject %q: %w", subject, err)
	}
	if reason := subjectReason(r); reason != "" {
		return nil, fmt.Errorf("nats.subject %q: %s", subject, reason)
	}
	if strings.ContainsAny(stream, " \t.*>") {
		return nil, fmt.Errorf("nats.stream %q is not a valid stream name", stream)
	}
	r.stream = stream
	r.reverse.exchange, r.reverse.routingKey, r.reverse.subject = r.exchange.matcher(r.spans), r.routingKey.matcher(r.spans), r.subject.matcher(r.spans)
	return r, nil
}

// subjectReason says why r's subject template cannot give valid subjects,
// or "".
func subjectReason(r *Route) string {
	if !r.subject.spanOK(r.spans) {
		return "{topic} and the capture of a final > may hold dots: only the subject's last token may hold them"
	}
	for _, p := range r.subject.parts {
		if p.ref == 0 && strings.ContainsAny(p.lit, " \t\r\n*>") {
			return "a subject's text takes no whitespace or wildcard"
		}
	}
	f := r.subject.filter(r.spans)
	if f == "" || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") || strings.Contains(f, "..") {
		return "a subject's tokens are not empty"
	}
	return ""
}
