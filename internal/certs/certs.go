// Package certs makes the webhook's serving certificate when no certificate
// manager is available: a private CA and a leaf certificate for the given
// host names. The Rotator shares them between replicas through one Secret and
// rotates them before they expire.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Bundle is a CA and a serving certificate signed by it, PEM-encoded.
type Bundle struct {
	CACert, Cert, Key []byte
}

// Generate makes a CA and a serving certificate for hosts (DNS names or IPs), valid for validity.
func Generate(hosts []string, validity time.Duration) (*Bundle, error) {
	now := time.Now()
	ca, err := newCA(now, validity)
	if err != nil {
		return nil, err
	}
	leaf, err := ca.issue(hosts, now, validity)
	if err != nil {
		return nil, err
	}
	return &Bundle{CACert: ca.certPEM, Cert: leaf.certPEM, Key: leaf.keyPEM}, nil
}

// keyPair is a certificate and its private key, parsed and PEM-encoded.
type keyPair struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

// newCA makes a self-signed CA valid from an hour before now (clock skew) for validity.
func newCA(now time.Time, validity time.Duration) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "fencekeeper-webhook-ca", SerialNumber: serial().String()},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	return encodePair(der, key)
}

// issue signs a serving certificate for hosts, valid for validity but never past the CA.
func (ca *keyPair) issue(hosts []string, now time.Time, validity time.Duration) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "fencekeeper-webhook"},
		NotBefore: now.Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("create serving certificate: %w", err)
	}
	return encodePair(der, key)
}

func encodePair(der []byte, key *ecdsa.PrivateKey) (*keyPair, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// WriteServingFiles writes tls.crt and tls.key (and ca.crt) into dir.
func (b *Bundle) WriteServingFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": b.Cert, "tls.key": b.Key, "ca.crt": b.CACert} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
