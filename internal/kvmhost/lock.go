package kvmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// LockEnv, set to "off", lets emulated hosts run side by side.
const LockEnv = "TERN_KVMHOST_LOCK"

// lockName is the file in the cache directory whose flock admits one
// emulated host at a time on this machine. Each is a two-vCPU TCG machine
// wanting every core; two at once (go test runs two packages at a time)
// halve each other's speed, and their guests' timing with it, for no
// gain in total.
const lockName = "tern-kvmhost.lock"

// acquireMachine waits until no other emulated host runs here and returns
// the release. The wait is bounded by ctx and says what it waits for once.
func acquireMachine(ctx context.Context, log io.Writer) (release func(), err error) {
	if os.Getenv(LockEnv) == "off" {
		return func() {}, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the cache directory for the emulated host's lock: %w", err)
	}
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("opening the emulated host's lock %s: %w", path, err)
	}
	start, said := time.Now(), false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if said {
				fmt.Fprintf(log, "kvmhost: the other emulated host finished after %.0fs\n", time.Since(start).Seconds())
			}
			return func() { f.Close() }, nil // closing drops the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !said {
			fmt.Fprintf(log, "kvmhost: waiting for another emulated test host on this machine to finish (one at a time; %s=off to allow more)\n", LockEnv)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another emulated test host to finish: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
