package certs

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"
)

// Action is the one step a rotator takes on the shared Secret.
type Action string

const (
	// ActionNone leaves the Secret as it is: it is good.
	ActionNone Action = "None"
	// ActionReset replaces an unreadable Secret or an expired CA with a new
	// CA and leaf (webhooks fail closed until the caBundle is patched).
	ActionReset Action = "Reset"
	// ActionRenewLeaf issues a new serving certificate from the current CA.
	ActionRenewLeaf Action = "RenewLeaf"
	// ActionStageCA adds a new CA to the bundle and makes it current, but
	// keeps serving the old CA's leaf until every verifier trusts the new CA.
	ActionStageCA Action = "StageCA"
	// ActionSwitchLeaf serves a leaf of the new CA, once the bundle with both
	// CAs has been published for Policy.Grace.
	ActionSwitchLeaf Action = "SwitchLeaf"
	// ActionRetireOldCA drops every CA but the current one from the bundle,
	// once every replica has served the new leaf for Policy.Grace.
	ActionRetireOldCA Action = "RetireOldCA"
)

// Policy sets validities and how early each renewal starts.
type Policy struct {
	CAValidity, LeafValidity       time.Duration
	CARenewBefore, LeafRenewBefore time.Duration
	// Grace bounds how long a replica may serve a stale certificate and the
	// API server may keep a stale caBundle: a few reload intervals.
	Grace time.Duration
}

// DefaultPolicy is a one-year CA and 90-day leaves, renewed well ahead.
func DefaultPolicy(reload time.Duration) Policy {
	return Policy{
		CAValidity: 365 * 24 * time.Hour, LeafValidity: 90 * 24 * time.Hour,
		CARenewBefore: 90 * 24 * time.Hour, LeafRenewBefore: 30 * 24 * time.Hour,
		Grace: 3*reload + time.Minute,
	}
}

// Validate rejects a policy that would renew in a loop or rotate the CA
// faster than replicas can follow.
func (p Policy) Validate() error {
	switch {
	case p.CAValidity <= 0 || p.LeafValidity <= 0 || p.Grace <= 0:
		return errors.New("certificate policy: validities and grace must be positive")
	case p.LeafRenewBefore >= p.LeafValidity:
		return fmt.Errorf("certificate policy: leaf renewal (%v before expiry) must start after issue (validity %v)", p.LeafRenewBefore, p.LeafValidity)
	case p.CARenewBefore <= p.LeafRenewBefore+2*p.Grace:
		// A leaf is capped at its CA's expiry; the CA must be staged before
		// such a leaf is due, and the two grace periods must fit before it.
		return fmt.Errorf("certificate policy: CA renewal (%v before expiry) must start more than leaf renewal (%v) plus two grace periods (%v) before", p.CARenewBefore, p.LeafRenewBefore, p.Grace)
	case p.CARenewBefore >= p.CAValidity:
		return fmt.Errorf("certificate policy: CA renewal (%v before expiry) must start after issue (validity %v)", p.CARenewBefore, p.CAValidity)
	}
	return nil
}

// State is what the shared Secret holds, parsed.
type State struct {
	CA     *x509.Certificate   // the current CA (issues new leaves)
	Leaf   *x509.Certificate   // the serving certificate every replica loads
	Bundle []*x509.Certificate // the CAs the webhook configuration trusts
	// StagedAt is when the current CA was staged; SwitchedAt when the leaf
	// moved to it (zero when not recorded).
	StagedAt, SwitchedAt time.Time
}

// Decide is the next step for s at now. Each step is small, so that replicas
// racing on the Secret (optimistic concurrency) each see a consistent state.
func Decide(s State, hosts []string, now time.Time, p Policy) Action {
	if s.CA == nil || s.Leaf == nil || len(s.Bundle) == 0 || !now.Before(s.CA.NotAfter) || !inBundle(s.CA, s.Bundle) {
		return ActionReset
	}
	if s.Leaf.CheckSignatureFrom(s.CA) != nil {
		// A new CA is staged: switch once every verifier has had time to trust it.
		if !inBundle(issuerOf(s.Leaf, s.Bundle), s.Bundle) || !now.Before(s.Leaf.NotAfter) {
			return ActionSwitchLeaf // the old leaf is unusable anyway
		}
		if !now.Before(s.StagedAt.Add(p.Grace)) {
			return ActionSwitchLeaf
		}
		return ActionNone
	}
	if len(s.Bundle) > 1 {
		if !now.Before(s.SwitchedAt.Add(p.Grace)) {
			return ActionRetireOldCA
		}
		return ActionNone
	}
	if s.CA.NotAfter.Sub(now) < p.CARenewBefore {
		return ActionStageCA
	}
	if s.Leaf.NotAfter.Sub(now) < p.LeafRenewBefore || !covers(s.Leaf, hosts) {
		return ActionRenewLeaf
	}
	return ActionNone
}

func inBundle(c *x509.Certificate, bundle []*x509.Certificate) bool {
	if c == nil {
		return false
	}
	for _, b := range bundle {
		if b.Equal(c) {
			return true
		}
	}
	return false
}

// issuerOf is the bundle CA that signed leaf, or nil.
func issuerOf(leaf *x509.Certificate, bundle []*x509.Certificate) *x509.Certificate {
	for _, b := range bundle {
		if leaf.CheckSignatureFrom(b) == nil {
			return b
		}
	}
	return nil
}

// covers reports whether leaf is valid for every host (DNS name or IP).
func covers(leaf *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// names are the leaf's DNS names and IPs as strings.
func names(leaf *x509.Certificate) []string {
	if leaf == nil {
		return nil
	}
	out := append([]string(nil), leaf.DNSNames...)
	for _, ip := range leaf.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// union keeps every name once, in order: replicas configured with different
// hosts then converge on one leaf that serves them all instead of fighting.
func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, h := range append(append([]string(nil), a...), b...) {
		key := h
		if ip := net.ParseIP(h); ip != nil {
			key = ip.String()
		}
		if h == "" || seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, h)
	}
	return out
}
