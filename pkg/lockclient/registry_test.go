package lockclient

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The registry's holder record makes a request HELD only when it names the
// request's own LockGrant by UID, and the held view carries the signed grant
// exactly as the issuer will mirror it.
func TestHeldFromRegistry(t *testing.T) {
	mine := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: "batch-1", UID: "uid-1"}}
	l := &Lock{requested: mine}
	holder := func(uid string) *locksv1.FencedResource {
		return &locksv1.FencedResource{Spec: locksv1.FencedResourceSpec{ResourceID: "billing/batch"},
			Status: locksv1.FencedResourceStatus{Holder: &locksv1.Holder{GrantName: "batch-1", GrantUID: uid, FenceToken: 7, TTLSeconds: 10,
				ExpiresAt: metav1.NewMicroTime(time.Unix(100, 0)), Digest: "sha256:d", Proof: "ed25519:k:p", ObservedRenewals: 2}}}
	}
	if lg := l.heldFromRecord(&locksv1.FencedResource{}); lg != nil {
		t.Fatalf("no holder: held %v", lg.Status)
	}
	if lg := l.heldFromRecord(holder("uid-0")); lg != nil {
		t.Fatal("a LockGrant of the same name but another UID (a deleted and re-created one) counted as ours")
	}
	lg := l.heldFromRecord(holder("uid-1"))
	if lg == nil || lg.Status.Phase != locksv1.PhaseHeld || lg.Status.Grant.FenceToken != 7 || lg.Status.Grant.Resource != "billing/batch" ||
		lg.Status.Proof != "ed25519:k:p" || lg.Status.ObservedRenewals != 2 || lg.UID != "uid-1" {
		t.Fatalf("held view = %+v", lg)
	}
	if mine.Status.Phase != "" {
		t.Fatal("heldFrom changed the LockGrant as requested")
	}
}

// A LockGrant view without the grant (the status mirror lagging behind the
// registry) does not replace a held view: the grant must stay readable.
func TestObserveIgnoresALaggingMirror(t *testing.T) {
	held := &locksv1.LockGrant{Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld, Grant: &locksv1.GrantDocument{FenceToken: 3}}}
	l := &Lock{view: held, state: StateHeld, done: make(chan struct{})}
	l.applyView(&locksv1.LockGrant{Status: locksv1.LockGrantStatus{Phase: locksv1.PhasePending}})
	if l.State() != StateHeld || l.Fence() != 3 {
		t.Fatalf("state %s, fence %d after a lagging mirror", l.State(), l.Fence())
	}
	l.applyView(&locksv1.LockGrant{Spec: locksv1.LockGrantSpec{Release: true},
		Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased, Grant: &locksv1.GrantDocument{FenceToken: 3}}})
	if l.State() != StateReleased {
		t.Fatalf("state %s after the mirror showed the release", l.State())
	}
}

// A grant can end before its Held mirror ever landed (the issuer mirrors off
// its critical path, and a plan that lost a race is made again from the
// registry, which no longer holds the grant): the terminal phase still ends
// the lock, and the grant it held stays readable.
func TestObserveEndsOnATerminalPhaseWithoutTheGrant(t *testing.T) {
	for _, c := range []struct {
		phase   locksv1.LockGrantPhase
		release bool
		state   State
		err     error
	}{
		{locksv1.PhaseReleased, true, StateReleased, ErrReleased},
		// Released without a release request: the issuer ended a deleted
		// holder; for the lock that is the server ending it, not a release.
		{locksv1.PhaseReleased, false, StateExpired, ErrExpired},
		{locksv1.PhaseExpired, false, StateExpired, ErrExpired},
		{locksv1.PhaseRevoked, false, StateExpired, ErrExpired},
	} {
		held := &locksv1.LockGrant{Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld, Grant: &locksv1.GrantDocument{FenceToken: 3}}}
		l := &Lock{view: held, state: StateHeld, done: make(chan struct{})}
		l.applyView(&locksv1.LockGrant{Spec: locksv1.LockGrantSpec{Release: c.release}, Status: locksv1.LockGrantStatus{Phase: c.phase}})
		if l.State() != c.state || !errors.Is(l.Err(), c.err) || l.Fence() != 3 {
			t.Errorf("%s without the grant: state %s, err %v, fence %d; want %s, %v, 3", c.phase, l.State(), l.Err(), l.Fence(), c.state, c.err)
		}
	}
}

// Attach in another process right after Acquire returned: the LockGrant is
// not mirrored yet, but the registry's holder record names it.
func TestAttachBeforeTheMirror(t *testing.T) {
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "batch-1", UID: "uid-1"},
		Spec: locksv1.LockGrantSpec{Resource: "batch", Owner: "worker-a", RequestID: "r1"}}
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "batch"},
		Spec: locksv1.FencedResourceSpec{ResourceID: "billing/batch"}}
	kube := fake.NewClientBuilder().WithScheme(locksv1.Scheme).WithObjects(lg, fr).WithStatusSubresource(fr).Build()
	c := New(kube, "billing", "worker-a")
	if _, err := c.Attach(context.Background(), "batch-1", AcquireOptions{}); !errors.Is(err, ErrOwnershipUnknown) {
		t.Fatalf("attach with no holder record: %v, want ErrOwnershipUnknown", err)
	}
	fr.Status.Holder = &locksv1.Holder{GrantName: "batch-1", GrantUID: "uid-1", FenceToken: 4, TTLSeconds: 30,
		ExpiresAt: metav1.NewMicroTime(time.Now().Add(30 * time.Second)), Proof: "ed25519:k:p"}
	if err := kube.Status().Update(context.Background(), fr); err != nil {
		t.Fatal(err)
	}
	l, err := c.Attach(context.Background(), "batch-1", AcquireOptions{})
	if err != nil {
		t.Fatalf("attach once the registry names the grant: %v", err)
	}
	defer l.Orphan()
	if l.State() != StateHeld || l.Fence() != 4 {
		t.Fatalf("state %s, fence %d", l.State(), l.Fence())
	}
}
