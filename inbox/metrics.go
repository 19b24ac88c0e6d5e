package inbox

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the inbox's counters; a nil *metrics counts nothing.
type metrics struct {
	processedVec, duplicatesVec, errorsVec *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	register := func(name, help string) (*prometheus.CounterVec, error) {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"source"})
		if err := reg.Register(c); err != nil {
			// A second Inbox on the same Registerer shares the counters.
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					return existing, nil
				}
			}
			return nil, err
		}
		for _, s := range []string{SourceAMQP, SourceNATS} {
			c.WithLabelValues(s)
		}
		return c, nil
	}
	var m metrics
	var err error
	if m.processedVec, err = register("relayd_inbox_processed_total",
		"Messages whose handler ran and committed, by source (amqp, nats)."); err != nil {
		return nil, err
	}
	if m.duplicatesVec, err = register("relayd_inbox_duplicates_total",
		"Messages acknowledged without running the handler because their id was already processed, by source."); err != nil {
		return nil, err
	}
	if m.errorsVec, err = register("relayd_inbox_errors_total",
		"Messages not processed: handler or database error (redelivered) or no usable id (rejected), by source."); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *metrics) processed(source string) {
	if m != nil {
		m.processedVec.WithLabelValues(source).Inc()
	}
}

func (m *metrics) duplicate(source string) {
	if m != nil {
		m.duplicatesVec.WithLabelValues(source).Inc()
	}
}

func (m *metrics) error(source string) {
	if m != nil {
		m.errorsVec.WithLabelValues(source).Inc()
	}
}
