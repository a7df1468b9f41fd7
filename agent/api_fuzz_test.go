package agent

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzAgentAPI sends arbitrary bodies and queries to the agent's
// decoding endpoints: every answer is a status below 500 or the 502 of a
// vmm that could not start, and nothing panics. The agent offers no
// capacity, so no valid request starts a process.
func FuzzAgentAPI(f *testing.F) {
	f.Add(uint8(0), "v1", []byte(`{"instance_id":"i","vcpus":1,"memory_mib":64,"spec":{}}`))
	f.Add(uint8(1), "v1", []byte(`[{"ip":"10.0.0.1","vni":100,"instance_id":"i","host_id":"h"}]`))
	f.Add(uint8(2), "3", []byte(nil))
	f.Add(uint8(3), "v1", []byte(`{"requested":"run"}`))
	f.Fuzz(func(t *testing.T, route uint8, arg string, body []byte) {
		a, err := New(Config{HostID: "h1", DataDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var req *http.Request
		switch route % 4 {
		case 0:
			req = httptest.NewRequest(http.MethodPut, "/v1/vmms/x", bytes.NewReader(body))
			req.SetPathValue("id", arg)
		case 1:
			req = httptest.NewRequest(http.MethodPut, "/v1/v2p", bytes.NewReader(body))
		case 2:
			req = httptest.NewRequest(http.MethodGet, "/v1/inventory", nil)
			q := req.URL.Query()
			q.Set("after_gen", arg)
			req.URL.RawQuery = q.Encode()
			// A generation ahead of the agent's waits: not for long.
			ctx, cancel := context.WithTimeout(req.Context(), 10*time.Millisecond)
			defer cancel()
			req = req.WithContext(ctx)
		case 3:
			req = httptest.NewRequest(http.MethodPut, "/v1/vmms/x/state", bytes.NewReader(body))
		}
		w := httptest.NewRecorder()
		switch route % 4 {
		case 0:
			a.putVMM(w, req)
		default:
			a.ServeHTTP(w, req)
		}
		if w.Code >= 500 && w.Code != http.StatusBadGateway {
			t.Fatalf("route %d %q %q: %d %s", route%4, arg, body, w.Code, w.Body)
		}
	})
}
