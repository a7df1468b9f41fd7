package kvmhost

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestOneEmulatedHostAtATime(t *testing.T) {
	t.Setenv(CacheEnv, t.TempDir())
	t.Setenv(LockEnv, "")
	release, err := acquireMachine(context.Background(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	if _, err := acquireMachine(ctx, &log); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second acquire while the first holds the machine: %v; want the deadline", err)
	}
	if !strings.Contains(log.String(), "waiting for another emulated test host") {
		t.Errorf("the wait said %q; want what it waits for", log.String())
	}
	release()
	got := make(chan error, 1)
	go func() {
		r, err := acquireMachine(context.Background(), &bytes.Buffer{})
		if err == nil {
			r()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("acquire after the release: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("acquire after the release did not return")
	}
}
