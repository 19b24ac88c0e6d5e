// Package amqpprop moves a message's headers into the AMQP basic properties
// they name (headers.AMQPProperties) and back: the relay's RabbitMQ sink
// publishes with it and backfill drains with it, so a message is the same
// either way. It is apart from package headers so that a producer that
// imports outbox does not pull in amqp091-go.
package amqpprop

import (
	"errors"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/headers"
)

// field is a property of headers.AMQPProperties with its field's index in
// amqp.Publishing and amqp.Delivery. Found by the table's field name, so a
// property is added in one place; a name amqp091-go lacks panics at start.
type field struct {
	headers.AMQPProperty
	pub, del int
}

// fields[i] is headers.AMQPProperties[i].
var fields = bind()

func bind() []field {
	pub, del := reflect.TypeFor[amqp.Publishing](), reflect.TypeFor[amqp.Delivery]()
	kind := map[headers.AMQPKind]reflect.Kind{headers.ShortString: reflect.String, headers.Milliseconds: reflect.String, headers.Octet: reflect.Uint8}
	fs := make([]field, len(headers.AMQPProperties))
	for i, p := range headers.AMQPProperties {
		pf, ok1 := pub.FieldByName(p.Field)
		df, ok2 := del.FieldByName(p.Field)
		if !ok1 || !ok2 || pf.Type.Kind() != kind[p.Kind] || df.Type.Kind() != kind[p.Kind] {
			panic(fmt.Sprintf("amqpprop: %s: amqp091-go's Publishing and Delivery have no field %s of kind %v", p.Header, p.Field, kind[p.Kind]))
		}
		fs[i] = field{p, pf.Index[0], df.Index[0]}
	}
	return fs
}

// Fill sets p's properties from those of h's headers that name one, and puts
// the others in p.Headers (left nil when there are none): a property header
// is moved, not copied, as a legacy publisher sets it. The error is a value
// the property cannot take (headers.AMQPReason), or one property named twice
// (content-type, Content-Type) with different values.
func Fill(p *amqp.Publishing, h map[string]string) error {
	var set uint64 // bit i: fields[i] is set
	v := reflect.ValueOf(p).Elem()
	for k, s := range h {
		i := headers.AMQPPropertyIndex(k)
		if i < 0 {
			if p.Headers == nil {
				p.Headers = make(amqp.Table, len(h))
			}
			p.Headers[k] = s
			continue
		}
		f := &fields[i]
		if r := headers.AMQPReason(k, s); r != "" {
			return errors.New(r)
		}
		again := set&(1<<i) != 0
		set |= 1 << i
		fv := v.Field(f.pub)
		if f.Kind == headers.Octet {
			n, _ := strconv.ParseUint(s, 10, 8) // "" is 0: none
			if again && fv.Uint() != n {
				return conflict(h, i)
			}
			fv.SetUint(n)
			continue
		}
		if again && fv.String() != s {
			return conflict(h, i)
		}
		fv.SetString(s)
	}
	return nil
}

// conflict is the error of h's headers naming fields[i] with different
// values, the names sorted so that a message always gets the same one.
func conflict(h map[string]string, i int) error {
	var names []string
	for k := range h {
		if headers.AMQPPropertyIndex(k) == i {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	vals := make([]string, len(names))
	for j, k := range names {
		vals[j] = h[k]
	}
	return fmt.Errorf("headers %q all set the AMQP %s, with values %q: which is meant is the producer's to say",
		names, fields[i].Header, vals)
}

// FromDelivery yields a header for each property d has set, under the
// property's name ("content-type": d.ContentType): the reverse of Fill. A
// zero priority is none, as amqp091-go cannot tell them apart.
func FromDelivery(d *amqp.Delivery) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		v := reflect.ValueOf(d).Elem()
		for _, f := range fields {
			fv := v.Field(f.del)
			s := ""
			if f.Kind == headers.Octet {
				if n := fv.Uint(); n != 0 {
					s = strconv.FormatUint(n, 10)
				}
			} else {
				s = fv.String()
			}
			if s != "" && !yield(f.Header, s) {
				return
			}
		}
	}
}
