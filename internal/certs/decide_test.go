package certs

import (
	"crypto/x509"
	"testing"
	"time"
)

var testPolicy = Policy{
	CAValidity: 100 * time.Hour, LeafValidity: 30 * time.Hour,
	CARenewBefore: 40 * time.Hour, LeafRenewBefore: 10 * time.Hour, Grace: time.Hour,
}

var t0 = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, at time.Time) *keyPair {
	t.Helper()
	ca, err := newCA(at, testPolicy.CAValidity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustLeaf(t *testing.T, ca *keyPair, at time.Time, hosts ...string) *x509.Certificate {
	t.Helper()
	l, err := ca.issue(hosts, at, testPolicy.LeafValidity)
	if err != nil {
		t.Fatal(err)
	}
	return l.cert
}

func TestDecide(t *testing.T) {
	oldCA, newCA := mustCA(t, t0), mustCA(t, t0.Add(61*time.Hour))
	fresh := mustLeaf(t, oldCA, t0, "127.0.0.1")
	oldLeafLate := mustLeaf(t, oldCA, t0.Add(50*time.Hour), "127.0.0.1")
	newLeaf := mustLeaf(t, newCA, t0.Add(63*time.Hour), "127.0.0.1")
	hosts := []string{"127.0.0.1"}
	staged := t0.Add(61 * time.Hour)
	switched := t0.Add(63 * time.Hour)
	cases := []struct {
		name  string
		s     State
		hosts []string
		at    time.Time
		want  Action
	}{
		{"empty Secret", State{}, hosts, t0, ActionReset},
		{"fresh", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{oldCA.cert}}, hosts, t0.Add(time.Hour), ActionNone},
		{"leaf due", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{oldCA.cert}}, hosts, t0.Add(21 * time.Hour), ActionRenewLeaf},
		{"leaf lacks a host", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{oldCA.cert}}, []string{"127.0.0.1", "svc.ns.svc"}, t0.Add(time.Hour), ActionRenewLeaf},
		{"CA due comes before the leaf", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{oldCA.cert}}, hosts, t0.Add(61 * time.Hour), ActionStageCA},
		{"CA expired", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{oldCA.cert}}, hosts, t0.Add(101 * time.Hour), ActionReset},
		{"CA not in bundle", State{CA: oldCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{newCA.cert}}, hosts, t0.Add(time.Hour), ActionReset},
		{"staged, within grace: keep the old leaf", State{CA: newCA.cert, Leaf: oldLeafLate, Bundle: []*x509.Certificate{newCA.cert, oldCA.cert}, StagedAt: staged}, hosts, staged.Add(59 * time.Minute), ActionNone},
		{"staged, grace over: switch", State{CA: newCA.cert, Leaf: oldLeafLate, Bundle: []*x509.Certificate{newCA.cert, oldCA.cert}, StagedAt: staged}, hosts, staged.Add(time.Hour), ActionSwitchLeaf},
		{"staged, old leaf already expired: switch now", State{CA: newCA.cert, Leaf: fresh, Bundle: []*x509.Certificate{newCA.cert, oldCA.cert}, StagedAt: staged}, hosts, staged.Add(time.Minute), ActionSwitchLeaf},
		{"switched, within grace: keep the old CA trusted", State{CA: newCA.cert, Leaf: newLeaf, Bundle: []*x509.Certificate{newCA.cert, oldCA.cert}, StagedAt: staged, SwitchedAt: switched}, hosts, switched.Add(59 * time.Minute), ActionNone},
		{"switched, grace over: retire", State{CA: newCA.cert, Leaf: newLeaf, Bundle: []*x509.Certificate{newCA.cert, oldCA.cert}, StagedAt: staged, SwitchedAt: switched}, hosts, switched.Add(time.Hour), ActionRetireOldCA},
		{"rotated", State{CA: newCA.cert, Leaf: newLeaf, Bundle: []*x509.Certificate{newCA.cert}}, hosts, switched.Add(2 * time.Hour), ActionNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Decide(c.s, c.hosts, c.at, testPolicy); got != c.want {
				t.Fatalf("Decide = %s, want %s", got, c.want)
			}
		})
	}
}

// TestRotationKeepsEveryServedLeafTrusted walks Apply through a full CA
// rotation, one replica serving the previous leaf a step behind: every leaf
// any replica may still serve verifies against the bundle published then.
func TestRotationKeepsEveryServedLeafTrusted(t *testing.T) {
	hosts := []string{"127.0.0.1", "localhost"}
	c, err := Apply(Contents{}, ActionReset, hosts, t0, testPolicy)
	if err != nil {
		t.Fatal(err)
	}
	var seen []Action
	served := c.Data[KeyTLSCert] // what a lagging replica still serves
	for now := t0; now.Before(t0.Add(400 * time.Hour)); now = now.Add(30 * time.Minute) {
		st, err := Parse(c)
		if err != nil {
			t.Fatalf("%v: %v", now, err)
		}
		a := Decide(st, hosts, now, testPolicy)
		if a == ActionReset {
			t.Fatalf("%v: a healthy rotation must never reset (outage)", now)
		}
		if a != ActionNone {
			seen = append(seen, a)
			if c, err = Apply(c, a, hosts, now, testPolicy); err != nil {
				t.Fatal(err)
			}
		}
		bundle, _ := parseCerts(c.Data[KeyCABundle])
		for _, pemLeaf := range [][]byte{served, c.Data[KeyTLSCert]} {
			leaf, _ := parseCert(pemLeaf)
			if !now.Before(leaf.NotAfter) {
				t.Fatalf("%v: a served leaf has expired (%v)", now, leaf.NotAfter)
			}
			if issuerOf(leaf, bundle) == nil {
				t.Fatalf("%v after %v: a served leaf is not trusted by the bundle", now, seen)
			}
		}
		served = c.Data[KeyTLSCert]
	}
	want := map[Action]bool{ActionRenewLeaf: true, ActionStageCA: true, ActionSwitchLeaf: true, ActionRetireOldCA: true}
	for _, a := range seen {
		delete(want, a)
	}
	if len(want) > 0 {
		t.Fatalf("actions %v never happened in 400h (saw %v)", want, seen)
	}
}

func TestRenewedLeafKeepsOtherReplicasHosts(t *testing.T) {
	c, err := Apply(Contents{}, ActionReset, []string{"a.example"}, t0, testPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = Apply(c, ActionRenewLeaf, []string{"b.example"}, t0, testPolicy); err != nil {
		t.Fatal(err)
	}
	st, _ := Parse(c)
	if !covers(st.Leaf, []string{"a.example", "b.example"}) {
		t.Fatalf("renewed leaf serves %v, want both replicas' hosts", names(st.Leaf))
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := testPolicy.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := DefaultPolicy(time.Minute).Validate(); err != nil {
		t.Fatal(err)
	}
	loop := testPolicy
	loop.CARenewBefore = loop.LeafRenewBefore
	if loop.Validate() == nil {
		t.Fatal("a CA renewed no earlier than its leaves must be rejected (capped leaves would renew in a loop)")
	}
}
