package control

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzControlAPI sends arbitrary bodies and queries to the control
// plane's report, migrate and leader endpoints of a leading server on an
// embedded etcd: every answer is below 500 and nothing panics. (The
// endpoints that make it reach agents at addresses taken from the body
// are left out: the fuzzer would dial anything.)
func FuzzControlAPI(f *testing.F) {
	e, err := StartEmbedded(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	srv := NewServer(Config{URL: "http://control.invalid", Etcd: e.Client, Root: "/tern-fuzz/"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)
	defer srv.Close()
	lead := httptest.NewRecorder()
	srv.ServeHTTP(lead, httptest.NewRequest(http.MethodGet, "/v1/leader?wait=leading", nil))
	if !bytes.Contains(lead.Body.Bytes(), []byte(`"leading":true`)) {
		f.Fatalf("the server did not lead: %s", lead.Body)
	}
	f.Add(uint8(0), "", []byte(`{"host_id":"h","vmm_id":"v","gen":3,"state":"running"}`))
	f.Add(uint8(1), "i1", []byte(`{"to":"h2"}`))
	f.Add(uint8(2), "leading", []byte(nil))
	f.Add(uint8(0), "", []byte(`{"host_id":"h","vmm_id":"v","gen":0,"migration_in":{"phase":"sync"}}`))
	f.Fuzz(func(t *testing.T, route uint8, arg string, body []byte) {
		var req *http.Request
		switch route % 3 {
		case 0:
			req = httptest.NewRequest(http.MethodPost, "/v1/reports", bytes.NewReader(body))
		case 1:
			req = httptest.NewRequest(http.MethodPost, "/v1/instances/x/migrate", bytes.NewReader(body))
			req.SetPathValue("name", arg)
		case 2:
			req = httptest.NewRequest(http.MethodGet, "/v1/leader", nil)
			q := req.URL.Query()
			q.Set("wait", arg)
			req.URL.RawQuery = q.Encode()
		}
		rctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		req = req.WithContext(rctx)
		w := httptest.NewRecorder()
		if route%3 == 1 {
			srv.migrateInstance(w, req)
		} else {
			srv.ServeHTTP(w, req)
		}
		if w.Code >= 500 {
			t.Fatalf("route %d %q %q: %d %s", route%3, arg, body, w.Code, w.Body)
		}
	})
}
