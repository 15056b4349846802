package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func grantOn(resource string, phase locksv1.LockGrantPhase, change func(*locksv1.LockGrant)) *locksv1.LockGrant {
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lg-" + resource},
		Spec: locksv1.LockGrantSpec{Resource: resource}, Status: locksv1.LockGrantStatus{Phase: phase}}
	if change != nil {
		change(lg)
	}
	return lg
}

func TestAsksNow(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		name string
		lg   *locksv1.LockGrant
		want bool
	}{
		{"new request", grantOn("a", "", nil), true},
		{"queued behind a holder", grantOn("a", locksv1.PhasePending, nil), false},
		{"held, nothing asked", grantOn("a", locksv1.PhaseHeld, nil), false},
		{"held, release asked", grantOn("a", locksv1.PhaseHeld, func(lg *locksv1.LockGrant) { lg.Spec.Release = true }), true},
		{"held, renewal asked", grantOn("a", locksv1.PhaseHeld, func(lg *locksv1.LockGrant) { lg.Spec.Renewals = 1 }), true},
		{"held, being deleted", grantOn("a", locksv1.PhaseHeld, func(lg *locksv1.LockGrant) { lg.DeletionTimestamp = &now }), true},
		{"released", grantOn("a", locksv1.PhaseReleased, func(lg *locksv1.LockGrant) { lg.Spec.Release = true }), false},
	} {
		if got := asksNow(c.lg); got != c.want {
			t.Errorf("%s: asksNow = %v, want %v", c.name, got, c.want)
		}
	}
}

// A new leader's initial list queues every LockGrant's resource at low
// priority; one asking for a decision goes ahead of those replayed before it.
func TestAskingFirstQueuesWhatAsksAheadOfTheSweep(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	h := askingFirst{handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{grantResource(o.(*locksv1.LockGrant))}
	})}
	ctx := context.Background()
	replay := func(lg *locksv1.LockGrant) {
		h.Create(ctx, event.CreateEvent{Object: lg, IsInInitialList: true}, q)
	}
	for _, r := range []string{"idle-1", "idle-2", "idle-3"} {
		replay(grantOn(r, locksv1.PhaseHeld, nil))
	}
	replay(grantOn("released", locksv1.PhaseHeld, func(lg *locksv1.LockGrant) { lg.Spec.Release = true }))
	replay(grantOn("fresh", "", nil))

	var order []string
	for range 5 {
		item, prio, _ := q.GetWithPriority()
		order = append(order, item.Name)
		if (item.Name == "released" || item.Name == "fresh") != (prio == 0) {
			t.Errorf("%s queued at priority %d", item.Name, prio)
		}
		q.Done(item)
	}
	if order[0] == order[1] || !(order[0] == "released" || order[0] == "fresh") || !(order[1] == "released" || order[1] == "fresh") {
		t.Fatalf("order = %v, want the release and the fresh request before the idle entries", order)
	}
}

// A new entry's first decision waits behind requests; a request for it
// raises it to the default priority.
func TestNewEntriesLastBehindRequests(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	entries := newEntriesLast{&handler.EnqueueRequestForObject{}}
	grants := askingFirst{handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{grantResource(o.(*locksv1.LockGrant))}
	})}
	ctx := context.Background()
	entry := func(name string) *locksv1.FencedResource {
		return &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	for _, n := range []string{"new-1", "new-2", "asked"} {
		entries.Create(ctx, event.CreateEvent{Object: entry(n)}, q)
	}
	grants.Create(ctx, event.CreateEvent{Object: grantOn("asked", "", nil)}, q)
	grants.Create(ctx, event.CreateEvent{Object: grantOn("other", "", nil)}, q)

	want := map[string]int{"asked": 0, "other": 0, "new-1": handler.LowPriority, "new-2": handler.LowPriority}
	var order []string
	for range 4 {
		item, prio, _ := q.GetWithPriority()
		order = append(order, item.Name)
		if prio != want[item.Name] {
			t.Errorf("%s queued at priority %d, want %d", item.Name, prio, want[item.Name])
		}
		q.Done(item)
	}
	if order[2] != "new-1" && order[2] != "new-2" {
		t.Fatalf("order = %v, want both requests before the new entries", order)
	}
}

// The echo of the issuer's latest own compare-and-swap asks for no
// decision; any other version of the FencedResource does, and so does the
// same version delivered again (a resync).
func TestShownOwnWritesSkipsTheEchoOfTheLatestOwnWrite(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	own := &ownWrites{}
	h := shownOwnWrites{&handler.EnqueueRequestForObject{}, own}
	ctx := context.Background()
	at := func(rv string) *locksv1.FencedResource {
		return &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "batch", ResourceVersion: rv}}
	}
	key := client.ObjectKeyFromObject(at(""))
	deliver := func(rv string) bool {
		before := q.Len()
		h.Update(ctx, event.UpdateEvent{ObjectOld: at("1"), ObjectNew: at(rv)}, q)
		if q.Len() > before {
			item, _ := q.Get()
			q.Done(item)
			return true
		}
		return false
	}
	own.wrote(key, "10", at("11"))
	own.wrote(key, "11", at("12"))
	for _, step := range []struct {
		rv   string
		want bool
		why  string
	}{
		{"11", true, "an own write before the latest: only the latest is remembered, so one decision too many, never one too few"},
		{"12", false, "the echo of the latest own write"},
		{"12", true, "the same version again"},
		{"13", true, "someone else's write"},
	} {
		if got := deliver(step.rv); got != step.want {
			t.Errorf("version %s (%s): queued %v, want %v", step.rv, step.why, got, step.want)
		}
	}
	own.wrote(key, "13", at("14"))
	own.forget(key)
	if !deliver("14") {
		t.Error("after forget (a lost swap, a deletion), the echo of the last own write was not queued")
	}
}
