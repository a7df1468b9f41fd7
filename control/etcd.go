package control

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// embeddedStartWait bounds how long the embedded etcd may take to be
// ready (it replays its log on restart).
const embeddedStartWait = time.Minute

// Embedded is a single-member etcd run in-process in a data directory,
// and a client to it.
type Embedded struct {
	etcd   *embed.Etcd
	Client *clientv3.Client
}

// StartEmbedded runs a single-member etcd in dir (created or reopened),
// listening on loopback ports of its own choosing: the control process is
// its only client, through an in-process client.
func StartEmbedded(dir string) (*Embedded, error) {
	cfg := embed.NewConfig()
	cfg.Name = "control"
	cfg.Dir = filepath.Join(dir, "etcd")
	free, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls = []url.URL{*free}
	cfg.AdvertiseClientUrls = []url.URL{*free}
	cfg.ListenPeerUrls = []url.URL{*free}
	cfg.AdvertisePeerUrls = []url.URL{*free}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(embeddedStartWait):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready within %v", embeddedStartWait)
	}
	return &Embedded{etcd: e, Client: v3client.New(e.Server)}, nil
}

// Close stops the member.
func (e *Embedded) Close() {
	e.Client.Close()
	e.etcd.Close()
}

// Connect returns a client of the etcd cluster at endpoints
// (comma-separated URLs).
func Connect(endpoints string) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("--etcd-endpoints %q: want comma-separated URLs", endpoints)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd %v: %w", eps, err)
	}
	return cli, nil
}
