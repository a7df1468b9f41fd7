package volumetest

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strconv"

	"tern/internal/tlsconf"
	"tern/volume/downstairs"
	"tern/volume/extent"
	"tern/volume/transport"
)

// Cluster is downstairs served in-process on loopback (three, or as many
// as NewClusterN asks for), each from a region in its own directory,
// with a fresh development CA.
type Cluster struct {
	Dir       string
	ServerTLS *tls.Config
	ClientTLS *tls.Config
	Spec      extent.Spec
	replicas  []*replica
}

type replica struct {
	dir    string
	addr   string // kept across restarts so the upstairs can reconnect
	region *extent.Region
	ln     *transport.Listener
	cancel context.CancelFunc
	done   chan error
}

// NewCluster creates certificates and three regions of spec under dir.
func NewCluster(dir string, spec extent.Spec) (*Cluster, error) { return NewClusterN(dir, spec, 3) }

// NewClusterN creates certificates and n regions of spec under dir (the
// shards of an erasure-coded volume share spec's UUID, as replicas do).
func NewClusterN(dir string, spec extent.Spec, n int) (*Cluster, error) {
	certs := filepath.Join(dir, "certs")
	if err := tlsconf.Generate(certs, nil, false); err != nil {
		return nil, err
	}
	b, err := tlsconf.Load(certs)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, ServerTLS: b.ServerConfig(), ClientTLS: b.ClientConfig("127.0.0.1"), Spec: spec, replicas: make([]*replica, n)}
	for i := range c.replicas {
		rdir := filepath.Join(dir, "region"+strconv.Itoa(i))
		if err := downstairs.Create(rdir, spec); err != nil {
			return nil, err
		}
		c.replicas[i] = &replica{dir: rdir}
	}
	return c, nil
}

// RegionDir is replica i's region directory.
func (c *Cluster) RegionDir(i int) string { return c.replicas[i].dir }

// Start serves replica i on a fresh loopback port (or the one it had).
func (c *Cluster) Start(i int) error {
	r := c.replicas[i]
	if r.ln != nil {
		return fmt.Errorf("replica %d already running", i)
	}
	addr := "127.0.0.1:0"
	if r.addr != "" {
		addr = r.addr
	}
	if r.region == nil {
		region, err := extent.Open(r.dir)
		if err != nil {
			return err
		}
		r.region = region
	}
	ln, err := transport.Listen(addr, c.ServerTLS)
	if err != nil {
		r.region.Close()
		r.region = nil
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.ln, r.cancel, r.done = ln, cancel, make(chan error, 1)
	r.addr = ln.Addr().String()
	srv := downstairs.NewServer(r.region, downstairs.Config{})
	go func() { r.done <- srv.Serve(ctx, ln) }()
	return nil
}

// StartAll serves every replica.
func (c *Cluster) StartAll() error {
	for i := range c.replicas {
		if err := c.Start(i); err != nil {
			c.Close()
			return err
		}
	}
	return nil
}

// Targets are the replicas' addresses, replica 0 first.
func (c *Cluster) Targets() []string {
	out := make([]string, len(c.replicas))
	for i, r := range c.replicas {
		if r.ln != nil {
			out[i] = r.ln.Addr().String()
		}
	}
	return out
}

// Stop stops serving replica i and closes its region.
func (c *Cluster) Stop(i int) error {
	r := c.replicas[i]
	if r.ln == nil {
		return nil
	}
	r.cancel()
	err := <-r.done
	r.ln.Close()
	r.ln = nil
	if cerr := r.region.Close(); err == nil {
		err = cerr
	}
	r.region = nil
	return err
}

// Close stops every replica.
func (c *Cluster) Close() error {
	var first error
	for i := range c.replicas {
		if err := c.Stop(i); err != nil && first == nil {
			first = err
		}
	}
	return first
}
