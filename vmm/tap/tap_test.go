package tap_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"tern/vmm/tap"
	"tern/vmm/tap/taptest"
)

// testEtherType is IEEE's local experimental EtherType: nothing of the
// kernel's own traffic uses it.
const testEtherType = 0x88b5

func frame(dst, src byte, payload string) []byte {
	f := []byte{dst, 0, 0, 0, 0, 1, src, 0, 0, 0, 0, 2, testEtherType >> 8, testEtherType & 0xff}
	return append(f, payload...)
}

func isTest(f []byte) bool {
	return len(f) >= 14 && f[12] == testEtherType>>8 && f[13] == testEtherType&0xff
}

func TestValidNameFollowsLinuxRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"tap0", true}, {"vm-7.eth0", true}, {strings.Repeat("x", 15), true},
		{"", false}, {strings.Repeat("x", 16), false}, {".", false}, {"..", false},
		{"a/b", false}, {"a:b", false}, {"a b", false}, {"a\tb", false}, {"a\x00", false},
	} {
		if err := tap.ValidName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidName(%q) = %v; want ok %v", tc.name, err, tc.ok)
		}
	}
	if _, err := tap.Open("bad/name"); err == nil {
		t.Error("Open of an invalid name succeeded")
	}
}

func TestFramesCrossTheTAPBothWays(t *testing.T) {
	ns := taptest.New(t)
	d := ns.OpenTAP(t, "tap0")
	peer := ns.Peer(t, "tap0")

	out := frame(0x02, 0x52, "from the guest")
	if err := d.WriteFrame(out); err != nil {
		t.Fatal(err)
	}
	got, err := peer.Receive("the frame written to the TAP", isTest, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, out) {
		t.Fatalf("host side got % x; want % x", got, out)
	}

	in := frame(0x52, 0x02, "to the guest")
	if err := peer.Send(in); err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, err := d.ReadFrame(buf)
			if err != nil {
				close(read) // closed at the deadline below
				return
			}
			if isTest(buf[:n]) {
				read <- buf[:n]
				return
			}
		}
	}()
	select {
	case got := <-read:
		if !bytes.Equal(got, in) {
			t.Fatalf("TAP read % x; want % x", got, in)
		}
	case <-time.After(10 * time.Second):
		d.Close()
		<-read
		t.Fatal("the frame sent into the TAP was not read from it within 10 s")
	}
}

func TestCloseEndsAWaitingRead(t *testing.T) {
	ns := taptest.New(t)
	d := ns.OpenTAP(t, "tap1")
	done := make(chan error, 1)
	go func() {
		_, err := d.ReadFrame(make([]byte, 2048))
		done <- err
	}()
	// The read may not have parked yet; Close wakes it either way.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, tap.ErrClosed) {
			t.Fatalf("read ended with %v; want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read waiting on the TAP did not end within 10 s of Close")
	}
}

func TestASecondOpenOfAnAttachedTAPSaysItIsInUse(t *testing.T) {
	ns := taptest.New(t)
	ns.OpenTAP(t, "tap2")
	err := ns.Do(func() error {
		d, err := tap.Open("tap2")
		if err == nil {
			d.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "already attached") {
		t.Fatalf("second Open: %v; want it to say the TAP is in use", err)
	}
}
