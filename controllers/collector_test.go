package controllers

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestDueForCollection(t *testing.T) {
	now := time.Unix(5000, 0)
	retention := time.Minute
	ended := func(name string, phase locksv1.LockGrantPhase) locksv1.LockGrant {
		lg := waiting(name, 0)
		lg.Status.Phase = phase
		return lg
	}
	released, expired, held, pending := ended("released", locksv1.PhaseReleased), ended("expired", locksv1.PhaseExpired),
		ended("held", locksv1.PhaseHeld), ended("pending", "")
	unresolved := ended("unresolved", locksv1.PhaseReleased)
	unresolved.Annotations = grantWithRecord("", locksv1.UnresolvedMutation{Object: "ConfigMap/x", Operation: "op", Fence: 1, Segment: 1,
		Payload: testPayload, Since: now}).Annotations
	// A value that is no record (planted by break-glass, or stored before
	// records were checked) records no write: it keeps nothing.
	garbage := ended("garbage", locksv1.PhaseReleased)
	garbage.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: `{"object":"ConfigMap/x"}`}
	deleting := ended("deleting", locksv1.PhaseDenied)
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	grants := []locksv1.LockGrant{released, expired, held, pending, unresolved, garbage, deleting}
	names := func(lgs []*locksv1.LockGrant) (n []string) {
		for _, lg := range lgs {
			n = append(n, lg.Name)
		}
		slices.Sort(n)
		return n
	}

	// First seen ended now: nothing is due yet, and only the collectable are remembered.
	due, seen := dueForCollection(grants, nil, now, retention)
	if len(due) != 0 || len(seen) != 3 {
		t.Fatalf("first pass: due %v, remembered %d; want none due, 3 remembered", names(due), len(seen))
	}
	// Just before the retention: still nothing.
	if due, seen = dueForCollection(grants, seen, now.Add(retention-time.Second), retention); len(due) != 0 {
		t.Fatalf("due before the retention: %v", names(due))
	}
	// The expired one was deleted by someone else meanwhile; the released one is due.
	due, seen = dueForCollection([]locksv1.LockGrant{released, held, pending, unresolved, garbage, deleting}, seen, now.Add(retention), retention)
	if got := names(due); !slices.Equal(got, []string{"garbage", "released"}) || len(seen) != 2 {
		t.Fatalf("at the retention: due %v, remembered %d; want [garbage released], remembered until they are gone", got, len(seen))
	}
	// Its delete was refused (a newer resourceVersion): still due next pass.
	if due, _ = dueForCollection([]locksv1.LockGrant{released}, seen, now.Add(retention+time.Second), retention); len(due) != 1 {
		t.Fatal("a LockGrant whose delete was refused is no longer due")
	}
	// Gone: forgotten.
	if _, seen = dueForCollection(nil, seen, now.Add(retention+time.Second), retention); len(seen) != 0 {
		t.Fatalf("remembered %d LockGrants that are gone", len(seen))
	}
	// Once its unknown write is resolved, the annotated one counts from then.
	unresolved.Annotations = nil
	later := now.Add(2 * retention)
	if due, seen = dueForCollection([]locksv1.LockGrant{unresolved}, seen, later, retention); len(due) != 0 {
		t.Fatal("a LockGrant whose record was just resolved collected at once")
	}
	if due, _ = dueForCollection([]locksv1.LockGrant{unresolved}, seen, later.Add(retention), retention); len(due) != 1 {
		t.Fatal("a resolved LockGrant not collected after the retention")
	}
}
