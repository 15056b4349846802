package controllers

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

func TestNextRotationStep(t *testing.T) {
	oldS, _ := grant.GenerateSigner(rand.Reader)
	newS, _ := grant.GenerateSigner(rand.Reader)
	other, _ := grant.GenerateSigner(rand.Reader)
	both := grant.NewTrustBundle(0, oldS, newS)
	onlyOld := grant.NewTrustBundle(0, oldS)
	onlyNew := grant.NewTrustBundle(0, newS)
	revoked := grant.NewTrustBundle(7, oldS, newS)
	newRevoked := grant.NewTrustBundle(7, newS)
	clash := grant.NewTrustBundle(0, oldS)
	clash.Keys[newS.KeyID()] = other.PublicKey()
	live := func(rev int64, keys ...string) locksv1.VerifierReport {
		return locksv1.VerifierReport{Replica: "r-" + strings.Join(keys, "+"), Keys: keys, RevokedBelow: rev, Live: true}
	}
	o, n := oldS.KeyID(), newS.KeyID()
	staged := func(b *grant.TrustBundle, vs ...locksv1.VerifierReport) rotationState {
		return rotationState{active: o, next: n, nextPub: newS.PublicKey(), bundle: b, verifiers: vs, requested: "r1", served: "r1"}
	}
	retiring := func(b *grant.TrustBundle, vs ...locksv1.VerifierReport) rotationState {
		return rotationState{active: n, retiring: o, revokeBelow: 7, bundle: b, verifiers: vs, requested: "r1", served: "r1"}
	}
	stale := locksv1.VerifierReport{Replica: "gone", Keys: []string{o}, Live: false}
	for _, tc := range []struct {
		name    string
		in      rotationState
		want    locksv1.RotationStep
		waiting string
	}{
		{"nothing requested", rotationState{active: o, bundle: onlyOld}, locksv1.StepIdle, ""},
		{"request already served", rotationState{active: o, bundle: onlyOld, requested: "r1", served: "r1"}, locksv1.StepIdle, ""},
		{"new request", rotationState{active: o, bundle: onlyOld, requested: "r2", served: "r1"}, locksv1.StepStage, ""},
		{"staged key not in bundle", staged(onlyOld, live(0, o)), locksv1.StepAddKey, ""},
		{"bundle has another key under the staged ID", staged(clash, live(0, o)), locksv1.StepBlocked, "different public key"},
		{"a verifier lags", staged(both, live(0, o, n), live(0, o)), locksv1.StepAwaitTrust, "r-" + o},
		{"no live verifier", staged(both, stale), locksv1.StepAwaitTrust, "no live verifier"},
		{"stale verifiers are not waited on", staged(both, live(0, o, n), stale), locksv1.StepSwitch, ""},
		{"every verifier trusts the new key", staged(both, live(0, o, n)), locksv1.StepSwitch, ""},
		{"switched: revoke", retiring(both, live(0, o, n)), locksv1.StepRevoke, ""},
		{"a verifier still enforces the old epoch", retiring(revoked, live(0, o, n)), locksv1.StepAwaitRevoked, "r-" + o + "+" + n},
		{"revoked everywhere: retire", retiring(revoked, live(7, o, n)), locksv1.StepRetire, ""},
		{"a verifier still trusts the retired key", retiring(newRevoked, live(7, o, n)), locksv1.StepAwaitRetired, "r-" + o + "+" + n},
		{"nobody trusts the retired key", retiring(newRevoked, live(7, n)), locksv1.StepFinish, ""},
		{"both staged and retiring", rotationState{active: n, next: "k-x", retiring: o, bundle: onlyNew}, locksv1.StepBlocked, "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, waiting := nextRotationStep(tc.in)
			if got != tc.want || !strings.Contains(waiting, tc.waiting) || (tc.waiting == "" && waiting != "") {
				t.Fatalf("nextRotationStep = %s (%q), want %s (%q)", got, waiting, tc.want, tc.waiting)
			}
		})
	}
}

func TestParseVerifierLease(t *testing.T) {
	now := time.Now()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: locksv1.VerifierLeasePrefix + "pod-1", Annotations: map[string]string{
			locksv1.AnnotationVerifierKeys: "k-a,k-b", locksv1.AnnotationVerifierRevokedBelow: "4"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("pod-1"), LeaseDurationSeconds: ptr.To(int32(6)),
			RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-5 * time.Second)))},
	}
	v := locksv1.ParseVerifierLease(l, now)
	if v.Replica != "pod-1" || !v.Live || v.RevokedBelow != 4 || strings.Join(v.Keys, ",") != "k-a,k-b" {
		t.Fatalf("got %+v", v)
	}
	if locksv1.ParseVerifierLease(l, now.Add(2*time.Second)).Live {
		t.Fatal("a lease past its duration is live")
	}
}

func TestRetireKeyKeepsABoundedHistory(t *testing.T) {
	cm := &corev1.ConfigMap{Data: map[string]string{}}
	var ids []string
	for i := 0; i < maxRetiredKeys+2; i++ {
		s, _ := grant.GenerateSigner(rand.Reader)
		cm.Data = grant.NewTrustBundle(0, s).Data()
		if err := retireKey(cm, s.KeyID()); err != nil {
			t.Fatal(err)
		}
		if _, ok := cm.Data[s.KeyID()]; ok {
			t.Fatalf("retired key %s still trusted", s.KeyID())
		}
		ids = append(ids, s.KeyID())
	}
	order := strings.Fields(cm.Annotations[retiredOrderAnnotation])
	if strings.Join(order, " ") != strings.Join(ids[2:], " ") {
		t.Fatalf("retired order %v, want the newest %d of %v", order, maxRetiredKeys, ids)
	}
	if strings.Contains(cm.Annotations[locksv1.AnnotationRetiredKeys], ids[0]) {
		t.Fatal("the oldest retired key was not forgotten")
	}
}
