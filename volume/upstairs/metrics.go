package upstairs

import (
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/uuid"

	"tern/volume/upstairs/engine"
)

// ioMetrics are the upstairs' IO counters, labelled by kind and upstairs.
type ioMetrics struct {
	kinds [engine.KindFlush + 1]kindMetrics
}

type kindMetrics struct {
	ops     *metrics.Counter
	errors  *metrics.Counter
	bytes   *metrics.Counter
	latency *metrics.Histogram
}

func newIOMetrics(set *metrics.Set, id uuid.UUID) *ioMetrics {
	m := &ioMetrics{}
	for _, k := range []engine.JobKind{engine.KindWrite, engine.KindRead, engine.KindFlush} {
		l := fmt.Sprintf(`{kind=%q,upstairs=%q}`, k, id)
		m.kinds[k] = kindMetrics{
			ops:     set.GetOrCreateCounter("tern_upstairs_io_total" + l),
			errors:  set.GetOrCreateCounter("tern_upstairs_io_errors_total" + l),
			bytes:   set.GetOrCreateCounter("tern_upstairs_io_bytes_total" + l),
			latency: set.GetOrCreateHistogram("tern_upstairs_io_duration_seconds" + l),
		}
	}
	return m
}

func (m *ioMetrics) observe(k engine.JobKind, bytes int, start time.Time, err error) {
	km := &m.kinds[k]
	km.ops.Inc()
	if err != nil {
		km.errors.Inc()
		return
	}
	km.bytes.Add(bytes)
	km.latency.UpdateDuration(start)
}
