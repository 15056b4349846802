package issuer

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestHolderEndedAt(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }
	h := &locksv1.Holder{ExpiresAt: metav1.NewMicroTime(now.Add(-3 * time.Second))}
	written := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Time: at(-20 * time.Second)}, {Time: at(-2 * time.Second)}, {Time: nil}}}}
	deleted := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: at(-5 * time.Second)}}
	future := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: at(time.Minute)}}
	for _, tc := range []struct {
		name  string
		phase locksv1.LockGrantPhase
		lg    *locksv1.LockGrant
		want  time.Time
	}{
		{"expiry counts from expiresAt", locksv1.PhaseExpired, written, now.Add(-3 * time.Second)},
		{"release counts from the last write", locksv1.PhaseReleased, written, now.Add(-2 * time.Second)},
		{"deletion counts from deletionTimestamp", locksv1.PhaseReleased, deleted, now.Add(-5 * time.Second)},
		{"a grant gone from the cache ended when seen", locksv1.PhaseReleased, nil, now},
		{"revocation ends when seen", locksv1.PhaseRevoked, written, now},
		{"never after now (another machine's clock)", locksv1.PhaseReleased, future, now},
	} {
		if got := holderEndedAt(tc.phase, h, tc.lg, now); !got.Equal(tc.want) {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestDecideRecordsWaitAndHandoff: the first grant waited from its request;
// a release handed off to a waiter counts from the release's write.
func TestDecideRecordsWaitAndHandoff(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}
	in := Input{Resource: f, Grants: grants, Now: t0.Add(3 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	out := apply(t, in).Counts
	if out.Issued != 1 || out.Waited != 3*time.Second || out.Handoffs != 0 {
		t.Fatalf("first issue: issued %d waited %s handoffs %d, want 1, 3s, 0", out.Issued, out.Waited, out.Handoffs)
	}
	released := metav1.NewTime(t0.Add(4 * time.Second))
	grants[0].Spec.Release = true
	grants[0].ManagedFields = []metav1.ManagedFieldsEntry{{Time: &released}}
	in.Now = t0.Add(6 * time.Second)
	out = apply(t, in).Counts
	if out.Handoffs != 1 || out.Waited != 5*time.Second || out.HandoffGap != 2*time.Second {
		t.Fatalf("handoff: handoffs %d waited %s gap %s, want 1, 5s, 2s", out.Handoffs, out.Waited, out.HandoffGap)
	}
}
