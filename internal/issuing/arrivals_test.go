package issuing

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A waiter that arrives while the lock is held joins the registry queue with
// the next compare-and-swap the issuer makes anyway, or after QueueDelay:
// read around the cache when first seen, not again at the handoff while the
// registry is still at the version that read was made at.
func TestDecideDefersArrivals(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0)}
	real0 := time.Unix(9000, 0)
	in := Input{Resource: f, Grants: grants, Now: t0.Add(time.Second), Epoch: 1, TakeoverAt: t0, Signer: testSigner(t), SeenNow: real0}
	apply(t, in) // a holds
	if f.Status.Holder == nil || f.Status.Holder.GrantName != "a" {
		t.Fatalf("a does not hold: %+v", f.Status.Holder)
	}
	f.ResourceVersion = "101"

	// b and c arrive; c was seen first by an earlier decision (that lost its
	// compare-and-swap), b now: FIFO by when the issuer first saw them.
	in.Grants = append(in.Grants, lg("b", time.Second), lg("c", 2*time.Second))
	in.Seen = Arrivals{FirstSeen: map[types.UID]time.Time{"uid-c": real0.Add(-100 * time.Millisecond)}}
	in.SeenNow = real0.Add(50 * time.Millisecond)
	d, err := Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if d.StatusChanged || len(d.Status.Queue) != 0 {
		t.Fatalf("arrivals alone written at once: changed %t, queue %+v", d.StatusChanged, d.Status.Queue)
	}
	if !slices.Equal(d.Unconfirmed, []string{"c", "b"}) {
		t.Fatalf("unconfirmed %v, want both arrivals read now (c first)", d.Unconfirmed)
	}
	if d.Deferred.ConfirmedAt != "101" || len(d.Deferred.FirstSeen) != 2 || !d.Deferred.Confirmed["uid-b"] {
		t.Fatalf("deferred %+v", d.Deferred)
	}
	if want := QueueDelay - 150*time.Millisecond; d.RequeueAfter != want {
		t.Fatalf("requeueAfter %v, want %v (c's deadline)", d.RequeueAfter, want)
	}
	for _, s := range d.GrantStatus {
		if s.Status.Phase == locksv1.PhasePending && s.Status.Conditions[0].Message != "waiting in the FIFO queue" {
			t.Fatalf("%s: %q", s.Name, s.Status.Conditions[0].Message)
		}
	}
	seen := d.Deferred

	// a releases: the handoff issues to c, queues b, and reads neither.
	in.Grants[0].Spec.Release = true
	in.Seen, in.SeenNow = seen, real0.Add(100*time.Millisecond)
	if d, err = Decide(in); err != nil {
		t.Fatal(err)
	}
	if !d.StatusChanged || d.Status.Holder == nil || d.Status.Holder.GrantName != "c" || len(d.Status.Queue) != 1 || d.Status.Queue[0].GrantName != "b" {
		t.Fatalf("handoff: holder %+v, queue %+v", d.Status.Holder, d.Status.Queue)
	}
	if len(d.Unconfirmed) != 0 || len(d.Deferred.FirstSeen) != 0 {
		t.Fatalf("handoff read %v again / kept %+v", d.Unconfirmed, d.Deferred)
	}
	// The same handoff from a registry at another version: both are read again.
	f.ResourceVersion = "102"
	if d, err = Decide(in); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Unconfirmed, []string{"c", "b"}) {
		t.Fatalf("unconfirmed %v after the registry moved on", d.Unconfirmed)
	}
	f.ResourceVersion = "101"

	// a still holds, QueueDelay passed for c: both join the registry queue now.
	in.Grants[0].Spec.Release = false
	in.SeenNow = real0.Add(QueueDelay)
	if d, err = Decide(in); err != nil {
		t.Fatal(err)
	}
	if !d.StatusChanged || len(d.Status.Queue) != 2 || d.Status.Queue[0].GrantName != "c" || len(d.Unconfirmed) != 0 {
		t.Fatalf("after QueueDelay: changed %t, queue %+v, unconfirmed %v", d.StatusChanged, d.Status.Queue, d.Unconfirmed)
	}
	// A caller without real time defers nothing.
	in.Seen, in.SeenNow = Arrivals{}, time.Time{}
	if d, err = Decide(in); err != nil {
		t.Fatal(err)
	}
	if !d.StatusChanged || len(d.Status.Queue) != 2 {
		t.Fatalf("without SeenNow: changed %t, queue %+v", d.StatusChanged, d.Status.Queue)
	}
}
