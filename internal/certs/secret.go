package certs

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// Keys of the shared Secret. tls.crt and tls.key are what every replica
// serves; ca-bundle.crt is what the webhook configuration trusts (the current
// CA, plus the previous one during a rotation).
const (
	KeyTLSCert  = "tls.crt"
	KeyTLSKey   = "tls.key"
	KeyCACert   = "ca.crt"
	KeyCAKey    = "ca.key"
	KeyCABundle = "ca-bundle.crt"

	// AnnotationStagedAt and AnnotationSwitchedAt (RFC 3339) time the two
	// waits of a CA rotation.
	AnnotationStagedAt   = "certs.fencekeeper.dev/ca-staged-at"
	AnnotationSwitchedAt = "certs.fencekeeper.dev/leaf-switched-at"
)

// Contents are the Secret's data and annotations, as the rotator reads and writes them.
type Contents struct {
	Data        map[string][]byte
	Annotations map[string]string
}

// Parse reads the state Decide needs; an error means the Secret must be reset.
func Parse(c Contents) (State, error) {
	var s State
	var err error
	if s.CA, err = parseCert(c.Data[KeyCACert]); err != nil {
		return State{}, fmt.Errorf("%s: %w", KeyCACert, err)
	}
	if s.Leaf, err = parseCert(c.Data[KeyTLSCert]); err != nil {
		return State{}, fmt.Errorf("%s: %w", KeyTLSCert, err)
	}
	if s.Bundle, err = parseCerts(c.Data[KeyCABundle]); err != nil {
		return State{}, fmt.Errorf("%s: %w", KeyCABundle, err)
	}
	if _, err := parseKey(c.Data[KeyCAKey]); err != nil {
		return State{}, fmt.Errorf("%s: %w", KeyCAKey, err)
	}
	if _, err := parseKey(c.Data[KeyTLSKey]); err != nil {
		return State{}, fmt.Errorf("%s: %w", KeyTLSKey, err)
	}
	s.StagedAt, _ = time.Parse(time.RFC3339, c.Annotations[AnnotationStagedAt])
	s.SwitchedAt, _ = time.Parse(time.RFC3339, c.Annotations[AnnotationSwitchedAt])
	return s, nil
}

// Apply returns the contents after action at now. hosts are this replica's;
// a new leaf serves them and every name the current leaf serves.
func Apply(c Contents, action Action, hosts []string, now time.Time, p Policy) (Contents, error) {
	out := Contents{Data: map[string][]byte{}, Annotations: map[string]string{}}
	for k, v := range c.Data {
		out.Data[k] = v
	}
	for k, v := range c.Annotations {
		out.Annotations[k] = v
	}
	stamp := now.UTC().Format(time.RFC3339)
	switch action {
	case ActionReset:
		ca, err := newCA(now, p.CAValidity)
		if err != nil {
			return Contents{}, err
		}
		setCA(out, ca, ca.certPEM)
		delete(out.Annotations, AnnotationStagedAt)
		delete(out.Annotations, AnnotationSwitchedAt)
		return out, issueInto(out, ca, hosts, now, p)
	case ActionStageCA:
		ca, err := newCA(now, p.CAValidity)
		if err != nil {
			return Contents{}, err
		}
		// New CA first, the old one kept: verifiers trust both.
		setCA(out, ca, append(append([]byte(nil), ca.certPEM...), c.Data[KeyCACert]...))
		out.Annotations[AnnotationStagedAt] = stamp
		return out, nil
	case ActionRenewLeaf, ActionSwitchLeaf:
		ca, err := loadCA(c)
		if err != nil {
			return Contents{}, err
		}
		if action == ActionSwitchLeaf {
			out.Annotations[AnnotationSwitchedAt] = stamp
		}
		leaf, _ := parseCert(c.Data[KeyTLSCert])
		return out, issueInto(out, ca, union(names(leaf), hosts), now, p)
	case ActionRetireOldCA:
		out.Data[KeyCABundle] = c.Data[KeyCACert]
		return out, nil
	case ActionNone:
		return out, nil
	}
	return Contents{}, fmt.Errorf("unknown certificate action %q", action)
}

func setCA(c Contents, ca *keyPair, bundle []byte) {
	c.Data[KeyCACert], c.Data[KeyCAKey], c.Data[KeyCABundle] = ca.certPEM, ca.keyPEM, bundle
}

func issueInto(c Contents, ca *keyPair, hosts []string, now time.Time, p Policy) error {
	leaf, err := ca.issue(hosts, now, p.LeafValidity)
	if err != nil {
		return err
	}
	c.Data[KeyTLSCert], c.Data[KeyTLSKey] = leaf.certPEM, leaf.keyPEM
	return nil
}

func loadCA(c Contents) (*keyPair, error) {
	cert, err := parseCert(c.Data[KeyCACert])
	if err != nil {
		return nil, err
	}
	key, err := parseKey(c.Data[KeyCAKey])
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key, certPEM: c.Data[KeyCACert], keyPEM: c.Data[KeyCAKey]}, nil
}

func parseCert(data []byte) (*x509.Certificate, error) {
	certs, err := parseCerts(data)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

func parseKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	return x509.ParseECPrivateKey(block.Bytes)
}
