package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names inside a certificate directory.
const (
	CAFile      = "ca.pem"
	CAKeyFile   = "ca-key.pem"
	NodeFile    = "node.pem"
	NodeKeyFile = "node-key.pem"
)

// DefaultHosts are the subject alternative names of a development leaf when
// the caller names none.
var DefaultHosts = []string{"127.0.0.1", "::1", "localhost"}

// Validity periods of generated certificates. The CA outlives the leaf so a
// leaf can be reissued under the same authority.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	nodeValidity = 2 * 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so peers with slightly slow clocks
	// accept a certificate made a moment ago.
	clockSkew = 5 * time.Minute
)

// ErrExists is returned by Generate when a certificate file is already
// present and force was not set.
var ErrExists = errors.New("certificate file already exists")

// Generate creates a development CA and one node certificate for hosts
// (IP addresses or DNS names) in dir, creating dir if needed. It refuses to
// replace existing files unless force is set, and leaves nothing
// half-written on failure.
func Generate(dir string, hosts []string, force bool) error {
	if len(hosts) == 0 {
		hosts = DefaultHosts
	}
	now := time.Now()
	ca, err := newAuthority(now, caValidity)
	if err != nil {
		return err
	}
	node, err := ca.issue(hosts, now, nodeValidity)
	if err != nil {
		return err
	}
	if err := writeAll(dir, force, map[string]pemFile{
		CAFile:      {ca.certPEM, 0o644},
		CAKeyFile:   {ca.keyPEM, 0o600},
		NodeFile:    {node.certPEM, 0o644},
		NodeKeyFile: {node.keyPEM, 0o600},
	}); err != nil {
		return err
	}
	return linkAliases(dir)
}

// Aliases are the names GnuTLS's x509 credential directories use
// (libnbd's tls-certificates, qemu's tls-creds-x509 dir=, nbdkit's
// --tls-certificates), each a relative symbolic link to the tern file of
// the same role, so a certificate directory serves those clients as it is.
var Aliases = map[string]string{
	"ca-cert.pem":     CAFile,
	"client-cert.pem": NodeFile,
	"client-key.pem":  NodeKeyFile,
	"server-cert.pem": NodeFile,
	"server-key.pem":  NodeKeyFile,
}

// linkAliases makes (or remakes) every alias in dir, each by renaming a
// new link over the name, so a reader never sees it missing.
func linkAliases(dir string) error {
	for alias, target := range Aliases {
		tmp := filepath.Join(dir, "."+alias+".link")
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return fmt.Errorf("linking %s: %w", alias, err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, alias)); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("linking %s: %w", alias, err)
		}
	}
	return syncDir(dir)
}

// keyPair is a certificate with its private key, both PEM-encoded, and the
// parsed forms needed to sign with it.
type keyPair struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

func newAuthority(now time.Time, validity time.Duration) (*keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"tern"}, CommonName: "tern development CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, nil)
}

// issue makes a leaf for hosts valid for both server and client auth.
func (ca *keyPair) issue(hosts []string, now time.Time, validity time.Duration) (*keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"tern"}, CommonName: "tern node"},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return sign(tmpl, ca)
}

// sign creates a key for tmpl and signs it with parent, or self-signs when
// parent is nil.
func sign(tmpl *x509.Certificate, parent *keyPair) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial: %w", err)
	}
	tmpl.SerialNumber = serial
	signerCert, signerKey := tmpl, key
	if parent != nil {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, &key.PublicKey, signerKey)
	if err != nil {
		return nil, fmt.Errorf("signing certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding key: %w", err)
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

type pemFile struct {
	data []byte
	mode os.FileMode
}

// writeAll stages every file as a temporary file in dir and renames them
// into place only when all were written and synced.
func writeAll(dir string, force bool, files map[string]pemFile) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating certificate directory: %w", err)
	}
	if !force {
		for name := range files {
			path := filepath.Join(dir, name)
			if _, err := os.Lstat(path); err == nil {
				return fmt.Errorf("writing %s: %w (use --force to replace it)", path, ErrExists)
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("checking %s: %w", path, err)
			}
		}
	}
	staged := make(map[string]string, len(files))
	defer func() {
		for _, tmp := range staged {
			os.Remove(tmp)
		}
	}()
	for name, f := range files {
		tmp, err := stage(dir, name, f)
		if err != nil {
			return err
		}
		staged[name] = tmp
	}
	for name, tmp := range staged {
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("installing %s: %w", name, err)
		}
		delete(staged, name)
	}
	return syncDir(dir)
}

func stage(dir, name string, f pemFile) (string, error) {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	path := tmp.Name()
	err = tmp.Chmod(f.mode)
	if err == nil {
		_, err = tmp.Write(f.data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return path, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing certificate directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing certificate directory: %w", err)
	}
	return nil
}
