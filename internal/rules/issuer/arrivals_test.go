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

// decideWithoutReads decides as the reconciler does with ConfirmLater, and
// fails the test if the decision reads anything but the names in allowed.
func decideWithoutReads(t *testing.T, in Input, allowed ...string) Decision {
	t.Helper()
	in.ConfirmLater = true
	d, err := DecideConfirmed(&in, func(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error) {
		for _, c := range cached {
			if !slices.Contains(allowed, c.Name) {
				t.Fatalf("the decision read %s around the cache; only %v may be read in it", c.Name, allowed)
			}
		}
		return cached, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// With ConfirmLater, arrivals while the lock is held are left to the
// caller's reads: no decision waits for them, a release that comes first
// hands off to the confirmed waiter and keeps the unconfirmed one out, the
// confirmation follows the issuer's own compare-and-swap, and a read of an
// older chain counts for nothing.
func TestDecideLeavesArrivalsToLaterReads(t *testing.T) {
	f, in := heldWithArrivals(t)
	d := decideWithoutReads(t, in)
	if d.StatusChanged || len(d.Status.Queue) != 0 || len(d.Unconfirmed) != 0 {
		t.Fatalf("arrivals: changed %t, queue %v, read in the decision %v", d.StatusChanged, queueNames(d), d.Unconfirmed)
	}
	if !slices.Equal(d.Confirm, []string{"c", "b"}) || len(d.Deferred.Confirmed) != 0 || d.Deferred.Since != "101" {
		t.Fatalf("confirm %v, deferred %+v; want c and b left to the caller in the chain of 101", d.Confirm, d.Deferred)
	}

	// c's read lands; a releases before b's does.
	in.Seen = d.Deferred.Confirm("101", []types.UID{"uid-c"})
	in.Grants[0].Spec.Release = true
	in.SeenNow = real0.Add(100 * time.Millisecond)
	d = decideWithoutReads(t, in)
	if h := d.Status.Holder; !d.StatusChanged || h == nil || h.GrantName != "c" || len(d.Status.Queue) != 0 {
		t.Fatalf("handoff: holder %+v, queue %v; want c holding and b kept out", h, queueNames(d))
	}
	if !slices.Equal(d.Confirm, []string{"b"}) {
		t.Fatalf("confirm %v, want [b]", d.Confirm)
	}

	// The handoff's compare-and-swap moved the registry to 102; b's read,
	// begun in the chain of 101, lands; b joins with the next decision
	// without a read.
	f.Status = d.Status
	f.ResourceVersion = "102"
	in.Grants[0].Status.Phase = locksv1.PhaseReleased
	in.Seen = d.Deferred.Committed("101", "102").Confirm("101", []types.UID{"uid-b"})
	in.SeenNow = real0.Add(150 * time.Millisecond)
	if in.Seen.ConfirmedAt != "102" || !in.Seen.Confirmed["uid-b"] {
		t.Fatalf("memory after the swap and b's read: %+v", in.Seen)
	}
	d = decideWithoutReads(t, in)
	if len(d.Confirm) != 0 || !d.Deferred.Confirmed["uid-b"] {
		t.Fatalf("confirm %v, deferred %+v: b is confirmed at 102", d.Confirm, d.Deferred)
	}

	// Someone else wrote the registry (103): the chain is broken, b is read
	// again, and a read from the old chain counts for nothing.
	f.ResourceVersion = "103"
	d = decideWithoutReads(t, in)
	if !slices.Equal(d.Confirm, []string{"b"}) || d.Deferred.Since != "103" {
		t.Fatalf("confirm %v, since %q after another writer; want b in a new chain", d.Confirm, d.Deferred.Since)
	}
	if got := d.Deferred.Confirm("101", []types.UID{"uid-b"}); got.Confirmed["uid-b"] {
		t.Fatal("a read of the old chain confirmed b in the new one")
	}
}

// When the lock is free, the arrival it is issued to is read in the
// decision (nobody waits for it but the arrival); the one behind it is left
// to the caller.
func TestDecideReadsTheArrivalItIssuesTo(t *testing.T) {
	_, in := heldWithArrivals(t)
	in.Grants = in.Grants[1:] // a is gone: nobody holds
	in.Resource.Status.Holder = nil
	d := decideWithoutReads(t, in, "c")
	if h := d.Status.Holder; h == nil || h.GrantName != "c" || !slices.Equal(d.Confirm, []string{"b"}) {
		t.Fatalf("holder %+v, confirm %v", h, d.Confirm)
	}
}
