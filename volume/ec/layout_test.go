package ec

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"tern/volume/ids"
)

func TestParseLayout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Layout
		err  bool
	}{
		{"ec", Layout{4, 2}, false},
		{"ec:4+2", Layout{4, 2}, false},
		{"ec:2+1", Layout{2, 1}, false},
		{"ec:8+3", Layout{8, 3}, false},
		{"ec:1+2", Layout{}, true},
		{"ec:9+2", Layout{}, true},
		{"ec:4+0", Layout{}, true},
		{"ec:4+4", Layout{}, true},
		{"ec:4-2", Layout{}, true},
		{"ec:+", Layout{}, true},
		{"replicated", Layout{}, true},
		{"ec:4+2x", Layout{}, true},
	} {
		got, err := ParseLayout(tc.in)
		if tc.err {
			if !errors.Is(err, ErrInvalidLayout) {
				t.Errorf("ParseLayout(%q) = %v, %v; want ErrInvalidLayout", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseLayout(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := ParseLayout(got.String()); err != nil || back != got {
			t.Errorf("ParseLayout(%q.String()) = %v, %v", tc.in, back, err)
		}
	}
}

// Every client block maps to exactly one (stripe, data shard), k
// consecutive aligned blocks fill one stripe, and Block inverts Locate.
func TestLocateRoundTrip(t *testing.T) {
	for k := MinData; k <= MaxData; k++ {
		l := Layout{Data: k, Parity: 2}
		seen := map[[2]uint64]bool{}
		for b := range ids.BlockIndex(10 * k) {
			st, d := l.Locate(b)
			if d < 0 || d >= k || st != b/ids.BlockIndex(k) {
				t.Fatalf("%v: Locate(%d) = %d, %d", l, b, st, d)
			}
			if l.Block(st, d) != b {
				t.Fatalf("%v: Block(Locate(%d)) = %d", l, b, l.Block(st, d))
			}
			key := [2]uint64{uint64(st), uint64(d)}
			if seen[key] {
				t.Fatalf("%v: block %d shares a place", l, b)
			}
			seen[key] = true
		}
		if sp := l.Span(ids.BlockIndex(k), uint64(k)); sp.First != 1 || sp.Last != 1 {
			t.Fatalf("%v: Span of one aligned stripe = %+v", l, sp)
		}
	}
}

func randomStripe(c *Codec, r *rand.Rand, bs int) [][]byte {
	s := make([][]byte, c.Layout.Shards())
	for i := range s {
		s[i] = make([]byte, bs)
		if i < c.Layout.Data {
			for j := range s[i] {
				s[i][j] = byte(r.Uint32())
			}
		}
	}
	if err := c.Encode(s); err != nil {
		panic(err)
	}
	return s
}

func clone(s [][]byte) [][]byte {
	out := make([][]byte, len(s))
	for i, b := range s {
		if b != nil {
			out[i] = bytes.Clone(b)
		}
	}
	return out
}

// Resolve: missing and suspect blocks are rebuilt from the trusted ones;
// one trusted block that disagrees is blamed when the rest agree (m ≥ 2);
// with no one to blame the data wins; too few trusted blocks is an error.
func TestResolve(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	c, _ := NewCodec(Layout{4, 2})
	good := randomStripe(c, r, 64)
	none := make([]bool, 6)

	blocks := clone(good)
	blocks[1], blocks[4] = nil, nil
	res, err := c.Resolve(blocks, none)
	if err != nil || res.How != Consistent || !res.Differs[1] || !res.Differs[4] || res.Differs[0] {
		t.Fatalf("two missing: %+v, %v", res.Differs, err)
	}
	for i := range good {
		if !bytes.Equal(res.Stripe[i], good[i]) {
			t.Fatalf("two missing: shard %d not rebuilt", i)
		}
	}

	blocks = clone(good)
	blocks[2][0] ^= 1
	res, err = c.Resolve(blocks, none)
	if err != nil || res.How != Outlier || !res.Differs[2] || !bytes.Equal(res.Stripe[2], good[2]) {
		t.Fatalf("one bad data block: how %v differs %v, %v", res.How, res.Differs, err)
	}

	blocks = clone(good)
	blocks[3][5] ^= 1
	sus := []bool{false, false, false, true, false, false}
	res, err = c.Resolve(blocks, sus)
	if err != nil || res.How != Consistent || !res.Differs[3] || !bytes.Equal(res.Stripe[3], good[3]) {
		t.Fatalf("suspect block: %v %v, %v", res.How, res.Differs, err)
	}

	c1, _ := NewCodec(Layout{4, 1})
	g1 := randomStripe(c1, r, 64)
	b1 := clone(g1)
	b1[4][0] ^= 1 // parity off, nobody to blame with one parity
	res, err = c1.Resolve(b1, make([]bool, 5))
	if err != nil || res.How != ParityRecomputed || !res.Differs[4] || !bytes.Equal(res.Stripe[4], g1[4]) {
		t.Fatalf("4+1 parity off: %v %v, %v", res.How, res.Differs, err)
	}

	blocks = clone(good)
	blocks[0], blocks[1], blocks[5] = nil, nil, nil
	if _, err := c.Resolve(blocks, none); !errors.Is(err, ErrTooFewShards) {
		t.Fatalf("three missing: %v, want ErrTooFewShards", err)
	}
}

// Overlapping stripe locks are granted in arrival order (a read queued
// behind a write waits for it), disjoint ones at once, shared ones
// together.
func TestStripeLocksOrder(t *testing.T) {
	var tl stripeLocks
	ctx := context.Background()
	w1, _ := tl.lock(ctx, 0, 3, true)
	r1, _ := tl.lock(ctx, 10, 12, false) // disjoint: granted at once
	r2, _ := tl.lock(ctx, 11, 11, false) // shared with r1
	got := make(chan string, 3)
	go func() {
		rel, _ := tl.lock(ctx, 2, 2, false)
		got <- "read"
		rel()
	}()
	select {
	case s := <-got:
		t.Fatalf("%s granted while an overlapping write holds its stripes", s)
	case <-time.After(50 * time.Millisecond):
	}
	w1()
	if s := <-got; s != "read" {
		t.Fatal(s)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := tl.lock(short, 12, 20, true); err == nil {
		t.Fatal("exclusive lock granted over shared ones")
	}
	r1()
	r2()
	if rel, err := tl.lock(ctx, 0, 100, true); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
}

// FuzzParseLayout: any text parses to a valid layout or an
// ErrInvalidLayout, never a panic, and a parsed layout prints back to
// itself.
func FuzzParseLayout(f *testing.F) {
	for _, s := range []string{"ec", "ec:4+2", "ec:8+3", "ec:0+0", "ec:-1+2", "ec:99999999999999999999+1", "replicated", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLayout(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidLayout) {
				t.Fatalf("ParseLayout(%q) = %v, not ErrInvalidLayout", s, err)
			}
			return
		}
		if l.Validate() != nil {
			t.Fatalf("ParseLayout(%q) = invalid %v", s, l)
		}
		if back, err := ParseLayout(l.String()); err != nil || back != l {
			t.Fatalf("round trip of %v: %v, %v", l, back, err)
		}
	})
}

// FuzzResolve: Resolve over any damage to a stripe (blocks dropped,
// bytes flipped, suspects marked) returns an error or a stripe whose
// parity matches its data, never a panic.
func FuzzResolve(f *testing.F) {
	f.Add(uint64(1), uint8(0), uint8(0), uint8(0))
	f.Add(uint64(2), uint8(3), uint8(4), uint8(1))
	f.Fuzz(func(t *testing.T, seed uint64, drop, flip, suspect uint8) {
		c, _ := NewCodec(Layout{4, 2})
		r := rand.New(rand.NewPCG(seed, 0))
		blocks := randomStripe(c, r, 32)
		sus := make([]bool, 6)
		for i := range 6 {
			if drop&(1<<i) != 0 {
				blocks[i] = nil
			} else if flip&(1<<i) != 0 {
				blocks[i][int(seed%32)] ^= 0x40
			}
			sus[i] = suspect&(1<<i) != 0
		}
		res, err := c.Resolve(blocks, sus)
		if err != nil {
			return
		}
		check := clone(res.Stripe)
		for i := 4; i < 6; i++ {
			check[i] = make([]byte, 32)
		}
		if err := c.Encode(check); err != nil {
			t.Fatal(err)
		}
		for i := range check {
			if !bytes.Equal(check[i], res.Stripe[i]) {
				t.Fatalf("resolved stripe's parity does not match its data (shard %d)", i)
			}
		}
	})
}

// Settle: a partial-stripe write of shard 1's block torn by a crash of
// every shard (shard 1's block torn at rest so it fails its hash, parity
// 4 took the write, parity 5 did not) is settled to the stripe whose
// rebuilt block 1 matches its recorded hash, old or new; with no match,
// to one of the two (four blocks agree with each).
func TestSettleTornStripe(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	c, _ := NewCodec(Layout{4, 2})
	old := randomStripe(c, r, 64)
	updated := clone(old)
	for j := range updated[1] {
		updated[1][j] = byte(r.Uint32())
	}
	if err := c.Encode(updated); err != nil {
		t.Fatal(err)
	}
	torn := [][]byte{old[0], nil, old[2], old[3], updated[4], old[5]}
	known := []bool{true, true, true, true, true, true}
	if _, err := c.Resolve(torn, make([]bool, 6)); !errors.Is(err, ErrInconsistentStripe) {
		t.Fatalf("Resolve of the torn stripe: %v, want ErrInconsistentStripe", err)
	}
	for _, tc := range []struct {
		name string
		want [][]byte
	}{{"recorded hash of the old block", old}, {"recorded hash of the block written", updated}} {
		rec := make([]uint64, 6)
		rec[1] = xxhash.Sum64(tc.want[1])
		res, err := c.Settle(torn, rec, known)
		if err != nil || res.How != Settled || !res.Differs[1] {
			t.Fatalf("%s: %v %v, %v", tc.name, res.How, res.Differs, err)
		}
		for i := range res.Stripe {
			if !bytes.Equal(res.Stripe[i], tc.want[i]) {
				t.Fatalf("%s: shard %d's block is not the version the hash names", tc.name, i)
			}
		}
	}
	rec := make([]uint64, 6)
	rec[1] = 12345 // torn so that no version matches: one of the two, whole
	res, err := c.Settle(torn, rec, known)
	if err != nil || res.How != Settled {
		t.Fatalf("no match: %v, %v", res.How, err)
	}
	if !bytes.Equal(res.Stripe[1], old[1]) && !bytes.Equal(res.Stripe[1], updated[1]) {
		t.Fatal("no match: block 1 rebuilt to neither version")
	}
	three := [][]byte{old[0], nil, nil, nil, old[4], old[5]}
	if _, err := c.Settle(three, rec, known); !errors.Is(err, ErrTooFewShards) {
		t.Fatalf("three present: %v, want ErrTooFewShards", err)
	}
}
