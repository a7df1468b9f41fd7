package migration

import (
	"path/filepath"
	"testing"
	"time"

	"tern/vmm/kvm/kvmtest"
)

// BenchmarkMigrateDirtyGuest migrates a 128 MiB dirty guest rewriting a
// 4 MiB working set, over loopback QUIC and by memfd, and reports the
// downtime and total time of each (booting the source is not timed).
func BenchmarkMigrateDirtyGuest(b *testing.B) {
	kvmtest.Require(b)
	for _, sameHost := range []bool{false, true} {
		b.Run(map[bool]string{false: "quic", true: "memfd"}[sameHost], func(b *testing.B) {
			var down, total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				a, spec := dirtySource(b, 128<<20, 4<<20)
				m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(b, spec)}}
				if sameHost {
					m.src.SameHostSocket = filepath.Join(b.TempDir(), "m.sock")
				}
				b.StartTimer()
				m.run(b)
				if m.err != nil || m.dstErr != nil {
					b.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
				}
				b.StopTimer()
				down += m.res.Downtime
				total += m.res.Total
				b.Logf("iteration %d: rounds %d, total %v, downtime %v, bandwidth %.0f MiB/s", i, m.res.Rounds, m.res.Total, m.res.Downtime,
					m.srcLog[len(m.srcLog)-1].BandwidthBytesPerSec/(1<<20))
				// Free the core and the memory before the next round (the
				// cleanups then find them closed).
				m.dstVM.Close()
				a.vm.Close()
			}
			b.ReportMetric(float64(down.Microseconds())/1000/float64(b.N), "downtime-ms")
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "total-ms")
		})
	}
}
