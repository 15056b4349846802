package issuer

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

var real0 = time.Unix(9000, 0)

// heldWithArrivals: a holds fence 1 (the registry at resourceVersion 101);
// b and c arrive, c seen first by an earlier decision that lost its
// compare-and-swap, b now.
func heldWithArrivals(t *testing.T) (*locksv1.FencedResource, Input) {
	t.Helper()
	f := fr(10)
	in := Input{Resource: f, Grants: []locksv1.LockGrant{lg("a", 0)}, Now: t0.Add(time.Second), Epoch: 1, TakeoverAt: t0,
		Signer: testSigner(t), SeenNow: real0}
	apply(t, in)
	if f.Status.Holder == nil || f.Status.Holder.GrantName != "a" {
		t.Fatalf("a does not hold: %+v", f.Status.Holder)
	}
	f.ResourceVersion = "101"
	in.Grants = append(in.Grants, lg("b", time.Second), lg("c", 2*time.Second))
	in.Seen = Arrivals{FirstSeen: map[types.UID]time.Time{"uid-c": real0.Add(-100 * time.Millisecond)}}
	in.SeenNow = real0.Add(50 * time.Millisecond)
	return f, in
}

// mustDecide decides as the reconciler does, with a read around the cache
// that finds each request as cached (never granted).
func mustDecide(t *testing.T, in Input) Decision {
	t.Helper()
	d, err := DecideConfirmed(&in, func(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error) { return cached, nil })
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func queueNames(d Decision) (n []string) {
	for _, q := range d.Status.Queue {
		n = append(n, q.GrantName)
	}
	return n
}

// A waiter that arrives while the lock is held is read around the cache at
// once but joins the registry queue only with the next compare-and-swap, in
// the order the issuer first saw the waiters.
func TestDecideDefersArrivals(t *testing.T) {
	_, in := heldWithArrivals(t)
	d := mustDecide(t, in)
	if d.StatusChanged || len(d.Status.Queue) != 0 {
		t.Fatalf("arrivals alone written at once: changed %t, queue %v", d.StatusChanged, queueNames(d))
	}
	if !slices.Equal(d.Unconfirmed, []string{"c", "b"}) {
		t.Fatalf("unconfirmed %v, want both arrivals read now, c first", d.Unconfirmed)
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
}

// The handoff that comes next issues to the first waiter and queues the
// other without reading either again, while the registry is still at the
// version they were confirmed at; at any other version both are read.
func TestDecideHandoffUsesDeferredConfirmation(t *testing.T) {
	f, in := heldWithArrivals(t)
	in.Seen = mustDecide(t, in).Deferred
	in.Grants[0].Spec.Release = true
	in.SeenNow = real0.Add(100 * time.Millisecond)
	d := mustDecide(t, in)
	if h := d.Status.Holder; !d.StatusChanged || h == nil || h.GrantName != "c" || !slices.Equal(queueNames(d), []string{"b"}) {
		t.Fatalf("handoff: holder %+v, queue %v", h, queueNames(d))
	}
	if len(d.Unconfirmed) != 0 || len(d.Deferred.FirstSeen) != 0 {
		t.Fatalf("handoff read %v again / kept %+v", d.Unconfirmed, d.Deferred)
	}
	f.ResourceVersion = "102"
	if d = mustDecide(t, in); !slices.Equal(d.Unconfirmed, []string{"c", "b"}) {
		t.Fatalf("unconfirmed %v after the registry moved on", d.Unconfirmed)
	}
}

// With nobody releasing, the waiters join the registry queue once the first
// has waited QueueDelay; a caller without real time defers nothing.
func TestDecideQueuesArrivalsAfterQueueDelay(t *testing.T) {
	_, in := heldWithArrivals(t)
	in.Seen = mustDecide(t, in).Deferred
	in.SeenNow = real0.Add(QueueDelay)
	d := mustDecide(t, in)
	if !d.StatusChanged || !slices.Equal(queueNames(d), []string{"c", "b"}) || len(d.Unconfirmed) != 0 {
		t.Fatalf("after QueueDelay: changed %t, queue %v, unconfirmed %v", d.StatusChanged, queueNames(d), d.Unconfirmed)
	}
	in.Seen, in.SeenNow = Arrivals{}, time.Time{}
	if d = mustDecide(t, in); !d.StatusChanged || len(d.Status.Queue) != 2 {
		t.Fatalf("without SeenNow: changed %t, queue %v", d.StatusChanged, queueNames(d))
	}
}

// A decision's reads around the cache come in one call (the reconciler makes
// them at once), in the decision's order; what they find is decided again.
func TestDecideConfirmedReadsArrivalsTogether(t *testing.T) {
	_, in := heldWithArrivals(t)
	var calls [][]string
	readAs := func(found func(*locksv1.LockGrant) *locksv1.LockGrant) ReadGrants {
		return func(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error) {
			var names []string
			out := make([]*locksv1.LockGrant, len(cached))
			for i, c := range cached {
				names = append(names, c.Name)
				out[i] = found(c)
			}
			calls = append(calls, names)
			return out, nil
		}
	}
	if _, err := DecideConfirmed(&in, readAs(func(c *locksv1.LockGrant) *locksv1.LockGrant { return c })); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || !slices.Equal(calls[0], []string{"c", "b"}) {
		t.Fatalf("reads %v, want one call for c and b", calls)
	}

	// b is gone at the API server, and c was granted by a pass the cache
	// missed: neither is queued or deferred, and nothing is read twice.
	calls = nil
	_, in = heldWithArrivals(t)
	d, err := DecideConfirmed(&in, readAs(func(c *locksv1.LockGrant) *locksv1.LockGrant {
		if c.Name == "b" {
			return nil
		}
		granted := c.DeepCopy()
		granted.Status.Phase, granted.Status.Grant = locksv1.PhaseHeld, &locksv1.GrantDocument{}
		return granted
	}))
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 {
		t.Fatalf("reads %v, want one call", calls)
	}
	if len(d.Status.Queue) != 0 || len(d.Deferred.FirstSeen) != 0 {
		t.Fatalf("queue %v, deferred %+v: a gone and a granted request are not waiting", queueNames(d), d.Deferred)
	}
}
