package ec

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func TestShardMetaRoundTrip(t *testing.T) {
	m := shardMeta{Layout: Layout{4, 2}, Shard: 5, Region: uuid.New(), Gen: 7, Flush: 99}
	block := make([]byte, 4096)
	m.encode(block)
	got, ok, err := decodeShardMeta(block)
	if err != nil || !ok || got != m {
		t.Fatalf("decode(encode(%+v)) = %+v, %v, %v", m, got, ok, err)
	}
	if _, ok, err := decodeShardMeta(make([]byte, 4096)); ok || err != nil {
		t.Fatalf("zero block: %v, %v; want absent", ok, err)
	}
	for _, damage := range []func([]byte){
		func(b []byte) { b[0] = 'X' },
		func(b []byte) { b[9] = 2 },
		func(b []byte) { b[41] ^= 1 },
		func(b []byte) { b[100] = 1 },
	} {
		b := slices.Clone(block)
		damage(b)
		if _, _, err := decodeShardMeta(b); !errors.Is(err, ErrBadShardMeta) {
			t.Errorf("damaged block decoded: %v", err)
		}
	}
}

// Targets given in another order than the shards were written in are
// refused at activation, naming the target and the shard it holds.
func TestActivationRefusesShardsInTheWrongOrder(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	mustWrite(t, v, pattern(1, 0, 8*testBlockSize), 0)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := c.config()
	cfg.Targets = slices.Clone(c.targets)
	cfg.Targets[0], cfg.Targets[1] = cfg.Targets[1], cfg.Targets[0]
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	err = w.Activate(ctxT(t), 2)
	if !errors.Is(err, ErrRegionMismatch) || !strings.Contains(err.Error(), "holds shard") {
		t.Fatalf("Activate with shards 0 and 1 swapped = %v", err)
	}
}

// FuzzShardMeta: any block decodes to a valid record, "absent" or
// ErrBadShardMeta, never a panic; a valid record encodes back to itself.
func FuzzShardMeta(f *testing.F) {
	good := make([]byte, 512)
	shardMeta{Layout: Layout{4, 2}, Shard: 3, Region: uuid.New(), Gen: 2, Flush: 10}.encode(good)
	f.Add(good)
	f.Add(make([]byte, 512))
	f.Add([]byte("TERNEC01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, ok, err := decodeShardMeta(b)
		if err != nil {
			if !errors.Is(err, ErrBadShardMeta) {
				t.Fatalf("error %v is not ErrBadShardMeta", err)
			}
			return
		}
		if !ok {
			return
		}
		again := make([]byte, len(b))
		m.encode(again)
		if back, ok, err := decodeShardMeta(again); err != nil || !ok || back != m {
			t.Fatalf("re-encoded %+v decodes to %+v, %v, %v", m, back, ok, err)
		}
	})
}
