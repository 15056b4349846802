package controllers

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// apiServer is the truth decide reads around its cache: LockGrants by name,
// and the names it was asked for. With together set, each read waits (up to
// a second) until that many are in flight at once.
type apiServer struct {
	grants   map[string]locksv1.LockGrant
	together int

	mu       sync.Mutex
	reads    []string
	inFlight int
	arrived  chan struct{}
	atOnce   bool
}

func (a *apiServer) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	a.mu.Lock()
	a.reads = append(a.reads, key.Name)
	if a.together > 0 {
		if a.arrived == nil {
			a.arrived = make(chan struct{})
		}
		if a.inFlight++; a.inFlight == a.together {
			a.atOnce = true
			close(a.arrived)
		}
		arrived := a.arrived
		a.mu.Unlock()
		select {
		case <-arrived:
		case <-time.After(time.Second):
		}
		a.mu.Lock()
		a.inFlight--
	}
	a.mu.Unlock()
	lg, ok := a.grants[key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: locksv1.GroupVersion.Group, Resource: "lockgrants"}, key.Name)
	}
	*obj.(*locksv1.LockGrant) = lg
	return nil
}

func (a *apiServer) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("decide never lists")
}

func waiting(name string, created time.Duration) locksv1.LockGrant {
	return locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Unix(1000, 0).Add(created))},
		Spec: locksv1.LockGrantSpec{Resource: "batch", Owner: "worker", RequestID: "req-" + name,
			Lease: "lease-" + name, OperationRoot: "sha256:" + string(bytes.Repeat([]byte("0"), 64))},
	}
}

func decideWith(t *testing.T, queue []locksv1.QueuedGrant, cache []locksv1.LockGrant, truth map[string]locksv1.LockGrant) (issuer.Decision, []string) {
	t.Helper()
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch", Generation: 1, ResourceVersion: "100"},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "batch/1", LeaseDurationSeconds: 10},
		Status:     locksv1.FencedResourceStatus{Queue: queue},
	}
	api := &apiServer{grants: truth}
	d := decideAgainst(t, api, fr, cache)
	slices.Sort(api.reads) // one decision's reads are made at once, in no order
	return d, api.reads
}

func decideAgainst(t *testing.T, api *apiServer, fr *locksv1.FencedResource, cache []locksv1.LockGrant) issuer.Decision {
	t.Helper()
	signer, err := grant.NewSigner("test", bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	r := &IssuerReconciler{APIReader: api}
	d, err := r.decide(context.Background(), &issuer.Input{Resource: fr, Grants: cache, Now: time.Unix(2000, 0), Epoch: 1, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A burst of arrivals is confirmed with its reads in flight at once: the
// pass, and a release waiting for it, takes one round trip, not one per
// arrival. Read one after another, the first would wait its second alone.
func TestDecideReadsArrivalsAtOnce(t *testing.T) {
	cache := []locksv1.LockGrant{waiting("a", 0), waiting("b", time.Second), waiting("c", 2*time.Second)}
	truth := map[string]locksv1.LockGrant{"a": cache[0], "b": cache[1], "c": cache[2]}
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch", Generation: 1, ResourceVersion: "100"},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "batch/1", LeaseDurationSeconds: 10},
	}
	api := &apiServer{grants: truth, together: 3}
	d := decideAgainst(t, api, fr, cache)
	if d.IssuedTo != "a" || len(api.reads) != 3 {
		t.Fatalf("issued to %q after reads %v; want a, each read once", d.IssuedTo, api.reads)
	}
	if !api.atOnce {
		t.Fatalf("the three reads %v were not in flight at once", api.reads)
	}
}

// A head confirmed when it was queued is issued without a read: the handoff's
// critical path holds no uncached GET.
func TestDecideIssuesAConfirmedHeadWithoutReading(t *testing.T) {
	a := waiting("a", 0)
	d, reads := decideWith(t, []locksv1.QueuedGrant{{GrantName: "a", GrantUID: "uid-a"}}, []locksv1.LockGrant{a}, nil)
	if d.IssuedTo != "a" || len(reads) != 0 {
		t.Fatalf("issued to %q after reads %v; want a, no reads", d.IssuedTo, reads)
	}
}

// The cache still shows "a" waiting, but the API server knows it was granted
// (and has since ended): it must not get a second fence. "b" is confirmed once
// and issued in its place.
func TestDecideDoesNotTrustAStaleCacheWithAFence(t *testing.T) {
	a, b := waiting("a", 0), waiting("b", time.Second)
	granted := a
	granted.Status = locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased, Grant: &locksv1.GrantDocument{FenceToken: 1}}
	d, reads := decideWith(t, nil, []locksv1.LockGrant{a, b}, map[string]locksv1.LockGrant{"a": granted, "b": b})
	if d.IssuedTo != "b" {
		t.Fatalf("issued to %q, want b", d.IssuedTo)
	}
	if want := []string{"a", "b"}; len(reads) != 2 || reads[0] != want[0] || reads[1] != want[1] {
		t.Fatalf("reads %v, want each LockGrant read once: %v", reads, want)
	}
}

// A queued entry whose LockGrant is gone from the API server is dropped, and
// an arrival the cache shows is queued only once confirmed.
func TestDecideDropsWhatTheAPIServerNoLongerHas(t *testing.T) {
	a, b := waiting("a", 0), waiting("b", time.Second)
	d, reads := decideWith(t, nil, []locksv1.LockGrant{a, b}, map[string]locksv1.LockGrant{"b": b})
	if d.IssuedTo != "b" || len(d.Status.Queue) != 0 {
		t.Fatalf("issued to %q, queue %v; want b and an empty queue", d.IssuedTo, d.Status.Queue)
	}
	if len(reads) != 2 {
		t.Fatalf("reads %v, want a and b once each", reads)
	}
}

// A decision's wait counts from its gather, not from the end of the
// reconcile that committed it: a compare-and-swap that took 30 ms leaves
// 470 ms of a 500 ms wait.
func TestLeftSinceCountsFromTheDecision(t *testing.T) {
	decided := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		after   time.Duration
		decided time.Time
		elapsed time.Duration
		want    time.Duration
	}{
		{"no wait asked for", 0, decided, 30 * time.Millisecond, 0},
		{"the swap's time is taken off", 500 * time.Millisecond, decided, 30 * time.Millisecond, 470 * time.Millisecond},
		{"a wait already over is the least one", 20 * time.Millisecond, decided, 30 * time.Millisecond, time.Millisecond},
		{"no decision time: as asked", 500 * time.Millisecond, time.Time{}, 30 * time.Millisecond, 500 * time.Millisecond},
	} {
		if got := leftSince(c.after, c.decided, decided.Add(c.elapsed)); got != c.want {
			t.Errorf("%s: leftSince(%v, +%v) = %v, want %v", c.name, c.after, c.elapsed, got, c.want)
		}
	}
}
