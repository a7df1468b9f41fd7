package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"tern/instance"
	"tern/instance/api"
	"tern/instance/apiv1"
)

// serve runs one request against srv in-process.
func serve(t *testing.T, srv *api.Server, method, path, body string) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec.Code, rec.Body.Bytes()
}

// TestMonitorAnswersWithTheCurrentSnapshotAfterThirtySeconds runs in a
// synctest bubble: a long-poll with nothing newer returns the current
// snapshot once the server's 30 s pass (fake time), and one waiting when
// the instance changes returns the change.
func TestMonitorAnswersWithTheCurrentSnapshotAfterThirtySeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &machines{}
		srv := api.NewServer(api.Config{Host: instance.Host{MaxVCPUs: 1}, NewMachine: f.new})
		b, _ := json.Marshal(spec("mon"))
		if code, body := serve(t, srv, "PUT", "/v1/instance", string(b)); code != 201 {
			t.Fatalf("ensure: %d %s", code, body)
		}
		synctest.Wait() // built, still creating: nothing more will happen
		var cur apiv1.View
		_, body := serve(t, srv, "GET", "/v1/instance/state", "")
		json.Unmarshal(body, &cur)
		if cur.State != apiv1.Creating {
			t.Fatalf("current %+v", cur)
		}
		start := time.Now()
		code, body := serve(t, srv, "GET", fmt.Sprintf("/v1/instance/state?after_gen=%d", cur.Gen), "")
		var got apiv1.View
		json.Unmarshal(body, &got)
		if code != 200 || got != cur || time.Since(start) != api.MonitorTimeout {
			t.Fatalf("long-poll with nothing newer: %d %+v after %v; want the current snapshot after %v", code, got, time.Since(start), api.MonitorTimeout)
		}
		done := make(chan apiv1.View)
		go func() {
			_, body := serve(t, srv, "GET", fmt.Sprintf("/v1/instance/state?after_gen=%d", cur.Gen), "")
			var s apiv1.View
			json.Unmarshal(body, &s)
			done <- s
		}()
		synctest.Wait()
		if code, _ := serve(t, srv, "PUT", "/v1/instance/state", `{"requested":"run"}`); code != 204 {
			t.Fatalf("run: %d", code)
		}
		// The waiter gets the latest snapshot, which may already be
		// past starting.
		if s := <-done; s.Gen <= cur.Gen || (s.State != apiv1.Starting && s.State != apiv1.Running) {
			t.Errorf("woken with %+v; want a gen after %d, starting or running", s, cur.Gen)
		}
		if err := srv.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
