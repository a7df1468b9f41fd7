package downstairs

import (
	"testing"

	"tern/volume/ids"
	"tern/volume/wire"
)

// TestAdmitIsTheSessionsRule: the admission rule the session applies
// (and the simulator asks through Admit).
func TestAdmitIsTheSessionsRule(t *testing.T) {
	for _, tc := range []struct {
		req              Request
		readOnly, active bool
		flushGen         ids.Generation
		want             wire.ErrorCode // 0: admitted
	}{
		{req: RequestWrite, active: true},
		{req: RequestWrite, readOnly: true, active: true, want: wire.CodeReadOnly},
		{req: RequestWrite, want: wire.CodeNotActive},
		{req: RequestRepairWrite, want: wire.CodeNotActive},
		{req: RequestRepairRead, want: wire.CodeNotActive},
		{req: RequestRead, want: wire.CodeNotActive},
		{req: RequestRead, readOnly: true},
		{req: RequestExtentHashes},
		{req: RequestExtentVersions},
		{req: RequestFlush, active: true, flushGen: 3},
		{req: RequestFlush, active: true, flushGen: 2, want: wire.CodeBadRequest},
	} {
		code, ok := Admit(tc.req, tc.readOnly, tc.active, tc.flushGen, 3)
		if ok != (tc.want == 0) || !ok && code != tc.want {
			t.Errorf("Admit(%v, read-only %v, active %v, flush gen %d) = %v, %v; want %v",
				kindNames[tc.req], tc.readOnly, tc.active, tc.flushGen, code, ok, tc.want)
		}
	}
}
