package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ErrExpired is returned by Load when the node certificate is outside its
// validity period.
var ErrExpired = errors.New("certificate expired or not yet valid")

// Bundle is a loaded certificate directory: the CA that peers must chain to
// and the node's own certificate.
type Bundle struct {
	// Roots holds the CA certificate(s) from ca.pem.
	Roots *x509.CertPool
	// Node is the leaf from node.pem and node-key.pem.
	Node tls.Certificate
}

// Load reads a certificate directory written by Generate.
func Load(dir string) (*Bundle, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("reading CA certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("reading CA certificate: no PEM certificate in %s", filepath.Join(dir, CAFile))
	}
	node, err := tls.LoadX509KeyPair(filepath.Join(dir, NodeFile), filepath.Join(dir, NodeKeyFile))
	if err != nil {
		return nil, fmt.Errorf("reading node certificate: %w", err)
	}
	leaf := node.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(node.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing node certificate: %w", err)
		}
		node.Leaf = leaf
	}
	if now := time.Now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("loading node certificate: %w (valid %s to %s)",
			ErrExpired, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("verifying node certificate against CA: %w", err)
	}
	return &Bundle{Roots: roots, Node: node}, nil
}

// ServerConfig is for a listener: it presents the node certificate and
// requires every client to present one that chains to the CA.
func (b *Bundle) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Node},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    b.Roots,
	}
}

// ClientConfig is for dialing serverName (a host name or IP address that
// must appear in the server's certificate): it presents the node
// certificate and verifies the server against the CA.
func (b *Bundle) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{b.Node},
		RootCAs:      b.Roots,
		ServerName:   serverName,
	}
}
