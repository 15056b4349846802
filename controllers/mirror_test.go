package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/issuing"
)

// mirrorFixture is a mirror over a fake API server holding LockGrants a and b.
func mirrorFixture(t *testing.T) (*grantMirror, client.Client, *events.FakeRecorder, []locksv1.LockGrant) {
	t.Helper()
	a, b := waiting("a", 0), waiting("b", time.Second)
	c := fake.NewClientBuilder().WithScheme(locksv1.Scheme).WithStatusSubresource(&locksv1.LockGrant{}).WithObjects(&a, &b).Build()
	var grants []locksv1.LockGrant
	for _, name := range []string{"a", "b"} {
		var lg locksv1.LockGrant
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &lg); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, lg)
	}
	rec := events.NewFakeRecorder(16)
	r := &GrantIssuerReconciler{Client: c, Recorder: rec}
	return newGrantMirror(r, 1, logr.Discard()), c, rec, grants
}

func phaseOf(t *testing.T, c client.Client, name string) locksv1.LockGrantPhase {
	t.Helper()
	var lg locksv1.LockGrant
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &lg); err != nil {
		t.Fatal(err)
	}
	return lg.Status.Phase
}

// A decision not yet mirrored is replaced by the next one for the same
// FencedResource: its LockGrant writes are planned again from the newer view,
// its Events are kept.
func TestMirrorCoalescesDecisionsOfOneResource(t *testing.T) {
	m, c, rec, grants := mirrorFixture(t)
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch"}}
	in := &issuing.Input{Resource: fr, Grants: grants}
	held := locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}
	m.enqueue(in, &issuing.Decision{GrantStatus: []issuing.GrantStatus{{Name: "a", Status: held}},
		Events: []issuing.Event{{Type: "Warning", Reason: "first", Note: "first"}}})
	m.enqueue(in, &issuing.Decision{GrantStatus: []issuing.GrantStatus{{Name: "b", Status: held}},
		Events: []issuing.Event{{Type: "Normal", Reason: "second", Note: "second"}}})
	if n := m.queue.Len(); n != 1 {
		t.Fatalf("%d keys queued, want 1", n)
	}
	if !m.next(context.Background()) {
		t.Fatal("the queue shut down")
	}
	if pa, pb := phaseOf(t, c, "a"), phaseOf(t, c, "b"); pa != "" || pb != locksv1.PhaseHeld {
		t.Fatalf("a is %q, b is %q; want only the newer plan written (b Held)", pa, pb)
	}
	if n := len(rec.Events); n != 2 {
		t.Fatalf("%d Events recorded, want both decisions' 2", n)
	}
}

// A plan made from a LockGrant that moved since is stale: nothing after it is
// written, and the issuer is asked to decide again.
func TestMirrorAsksForANewDecisionWhenItsPlanIsStale(t *testing.T) {
	m, c, _, grants := mirrorFixture(t)
	fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch"}}
	moved := grants[0].DeepCopy()
	moved.Labels = map[string]string{"moved": "yes"}
	if err := c.Update(context.Background(), moved); err != nil {
		t.Fatal(err)
	}
	released := locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased}
	m.enqueue(&issuing.Input{Resource: fr, Grants: grants}, &issuing.Decision{GrantStatus: []issuing.GrantStatus{
		{Name: "a", Status: released}, {Name: "b", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}}})
	m.next(context.Background())
	if pa, pb := phaseOf(t, c, "a"), phaseOf(t, c, "b"); pa != "" || pb != "" {
		t.Fatalf("a is %q, b is %q; want nothing written after the stale first write", pa, pb)
	}
	select {
	case e := <-m.replan:
		if e.Object.GetName() != "batch" {
			t.Fatalf("replan of %s, want batch", e.Object.GetName())
		}
	default:
		t.Fatal("the issuer was not asked to decide again")
	}
}
