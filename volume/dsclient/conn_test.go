package dsclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"tern/volume"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/volumetest"
	"tern/volume/wire"
)

// newDownstairs serves one region of 4 extents on loopback.
func newDownstairs(t *testing.T) *volumetest.Cluster {
	t.Helper()
	cl, err := volumetest.NewClusterN(t.TempDir(), extent.NewSpec(4096, 16, 4), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	return cl
}

func dial(t *testing.T, ctx context.Context, cl *volumetest.Cluster) *Conn {
	t.Helper()
	c, err := Dial(ctx, cl.Targets()[0], cl.ClientTLS, Options{ReplyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close("test done") })
	return c
}

func TestSetupActivatesAndReadsEveryExtentVersion(t *testing.T) {
	cl := newDownstairs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dial(t, ctx, cl)
	upstairs := uuid.New()
	region, err := c.Hello(HelloParams{RegionUUID: cl.Spec.UUID, UpstairsID: upstairs})
	if err != nil {
		t.Fatal(err)
	}
	if region.UUID != cl.Spec.UUID || region.ExtentCount != 4 || region.BlockSize != 4096 {
		t.Fatalf("region %+v, want the served spec %+v", region, cl.Spec)
	}
	if _, err := c.Activate(ctx, upstairs, 3); err != nil {
		t.Fatal(err)
	}
	versions, err := c.ExtentVersions(region.ExtentCount)
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != 4 {
		t.Fatalf("%d extent versions, want 4", len(versions))
	}
}

func TestHelloForAnotherRegionIsRefusedAsRegionMismatch(t *testing.T) {
	cl := newDownstairs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dial(t, ctx, cl)
	_, err := c.Hello(HelloParams{RegionUUID: uuid.New(), UpstairsID: uuid.New()})
	var e *Error
	if !errors.As(err, &e) || e.Step != StepHello || e.Failure != FailRefused || e.Code != wire.CodeRegionMismatch {
		t.Fatalf("Hello for another region: %v, want a refusal with CodeRegionMismatch", err)
	}
	if !errors.Is(err, volume.ErrRegionMismatch) {
		t.Fatalf("%v does not match volume.ErrRegionMismatch", err)
	}
}

func TestActivateAtAnAcceptedGenerationIsRefusedAsGenTooLow(t *testing.T) {
	cl := newDownstairs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	activate := func(gen ids.Generation) error {
		c, upstairs := dial(t, ctx, cl), uuid.New()
		if _, err := c.Hello(HelloParams{UpstairsID: upstairs}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Activate(ctx, upstairs, gen)
		return err
	}
	if err := activate(5); err != nil {
		t.Fatal(err)
	}
	err := activate(5)
	var e *Error
	if !errors.As(err, &e) || e.Step != StepActivate || e.Failure != FailRefused || e.Gen != 5 {
		t.Fatalf("second Activate at 5: %v, want a refusal of generation 5", err)
	}
	if !errors.Is(err, volume.ErrGenTooLow) || errors.Is(err, volume.ErrFenced) {
		t.Fatalf("%v: want volume.ErrGenTooLow only", err)
	}
}

func TestCallReturnsTheReplyToItsJob(t *testing.T) {
	cl := newDownstairs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dial(t, ctx, cl)
	if _, err := c.Hello(HelloParams{ReadOnly: true, UpstairsID: uuid.New()}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Call(&wire.ExtentVersionsRequest{First: 1, Count: 2}, 7)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := m.(*wire.ExtentVersions)
	if !ok || ev.JobID != 7 || ev.First != 1 || len(ev.Versions) != 2 {
		t.Fatalf("reply %#v, want job 7's two extent versions from extent 1", m)
	}
	_, err = c.Call(&wire.Activate{}, 8)
	var e *Error
	if !errors.As(err, &e) || e.Step != StepCall || e.Failure != FailSend {
		t.Fatalf("Call with an Activate: %v, want a send failure (not a request by job id)", err)
	}
}
