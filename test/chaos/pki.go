package chaos

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki is the replicated control plane's one CA: it signs both API servers'
// serving certificates and every user's client certificate (CN = user, O =
// groups), so any user authenticates at either API server.
type pki struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	caPEM  []byte
	issued int64 // serial number of the last certificate
}

func newPKI() (*pki, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fencekeeper-chaos-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &pki{cert: cert, key: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), issued: 1}, nil
}

// issue returns a PEM certificate and key: a server certificate for ips, or
// (no ips) a client certificate for user cn in groups.
func (p *pki) issue(cn string, groups []string, ips []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	p.issued++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.issued), Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(ips) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, ip := range ips {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
		}
		tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// user is a client identity with a kubeconfig per API server.
type user struct {
	name            string
	certPEM, keyPEM []byte
	kubeconfigs     []string // one per API server, same order
}

func (p *pki) user(dir, name string, groups []string, servers []string) (*user, error) {
	c, k, err := p.issue(name, groups, nil)
	if err != nil {
		return nil, err
	}
	u := &user{name: name, certPEM: c, keyPEM: k}
	for i, s := range servers {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: s, CertificateAuthorityData: p.caPEM}
		cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: c, ClientKeyData: k}
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		cfg.CurrentContext = "c"
		path := filepath.Join(dir, sanitize(name)+"-"+string(rune('a'+i))+".kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			return nil, err
		}
		u.kubeconfigs = append(u.kubeconfigs, path)
	}
	return u, nil
}

// restConfig is the user's config for server.
func (p *pki) restConfig(u *user, server string) *rest.Config {
	return &rest.Config{Host: server, QPS: 200, Burst: 400, Timeout: 15 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM, CertData: u.certPEM, KeyData: u.keyPEM}}
}

// serviceAccountKey writes the service-account signing key pair.
func serviceAccountKey(dir string) (pub, priv string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	pder, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	priv, pub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	return pub, priv, os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), 0o600)
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}
