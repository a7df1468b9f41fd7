package downstairs

import (
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// serverMetrics are the downstairs' counters, registered in a
// metrics.Set (names prefixed tern_downstairs_).
type serverMetrics struct {
	jobs         [kindCount]*metrics.Counter
	jobErrors    [kindCount]*metrics.Counter
	latency      [kindCount]*metrics.Histogram
	bytesRead    *metrics.Counter
	bytesWritten *metrics.Counter
	fenced       *metrics.Counter
	sessions     atomic.Int64
}

func newServerMetrics(set *metrics.Set, srv *Server) *serverMetrics {
	m := &serverMetrics{
		bytesRead:    set.GetOrCreateCounter("tern_downstairs_read_bytes_total"),
		bytesWritten: set.GetOrCreateCounter("tern_downstairs_written_bytes_total"),
		fenced:       set.GetOrCreateCounter("tern_downstairs_fenced_sessions_total"),
	}
	for k := range kindCount {
		if k == kindNotice {
			continue
		}
		label := `{kind="` + kindNames[k] + `"}`
		m.jobs[k] = set.GetOrCreateCounter("tern_downstairs_jobs_total" + label)
		m.jobErrors[k] = set.GetOrCreateCounter("tern_downstairs_job_errors_total" + label)
		m.latency[k] = set.GetOrCreateHistogram("tern_downstairs_job_duration_seconds" + label)
	}
	set.GetOrCreateGauge("tern_downstairs_sessions", func() float64 { return float64(m.sessions.Load()) })
	set.GetOrCreateGauge("tern_downstairs_active_sessions", func() float64 {
		if srv.activeSession() {
			return 1
		}
		return 0
	})
	return m
}

// observe records a job whose reply was just sent.
func (m *serverMetrics) observe(j *job) {
	if j.kind == kindNotice {
		return
	}
	m.jobs[j.kind].Inc()
	m.latency[j.kind].UpdateDuration(j.started)
	if j.failed || j.fenced != nil {
		m.jobErrors[j.kind].Inc()
		return
	}
	switch j.kind {
	case kindRead, kindRepairRead:
		m.bytesRead.Add(len(j.data()))
	case kindWrite, kindRepairWrite:
		m.bytesWritten.Add(len(j.data()))
	}
}
