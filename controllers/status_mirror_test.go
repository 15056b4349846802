package controllers

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

func TestStatusMirror(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	a, b := waiting("a", 0), waiting("b", time.Second)
	grants := map[string]*locksv1.LockGrant{"a": &a, "b": &b}
	held := issuer.GrantStatus{Name: "b", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}
	released := issuer.GrantStatus{Name: "a", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased}}
	names := func(ss []issuer.GrantStatus) (n []string) {
		for _, s := range ss {
			n = append(n, s.Name)
		}
		return n
	}

	// A handoff: the ending is written at once, the new holder's Held waits.
	write, wait := f.due([]issuer.GrantStatus{released, held}, grants)
	if got := names(write); len(got) != 1 || got[0] != "a" || wait != heldMirrorDelay {
		t.Fatalf("write %v, wait %v; want [a], %v", got, wait, heldMirrorDelay)
	}
	// Planned again 40 ms later (another event): still waiting, counted from the first plan.
	now = now.Add(40 * time.Millisecond)
	if write, wait = f.due([]issuer.GrantStatus{held}, grants); len(write) != 0 || wait != 60*time.Millisecond {
		t.Fatalf("write %v, wait %v; want nothing for 60ms more", names(write), wait)
	}
	// Due: written.
	now = now.Add(60 * time.Millisecond)
	if write, wait = f.due([]issuer.GrantStatus{held}, grants); len(write) != 1 || wait != 0 {
		t.Fatalf("write %v, wait %v; want [b] now", names(write), wait)
	}
	// Queued: the Pending status waits too; its condition updates within the phase do not.
	d := waiting("d", 3*time.Second)
	grants["d"] = &d
	pending := issuer.GrantStatus{Name: "d", Status: locksv1.LockGrantStatus{Phase: locksv1.PhasePending}}
	if write, _ = f.due([]issuer.GrantStatus{pending}, grants); len(write) != 0 {
		t.Fatal("a new waiter's Pending written at once")
	}
	d.Status.Phase = locksv1.PhasePending
	if write, _ = f.due([]issuer.GrantStatus{pending}, grants); len(write) != 1 {
		t.Fatal("a Pending update within the phase deferred")
	}
	// Once mirrored, a renewal's Held is written at once.
	b.Status.Phase = locksv1.PhaseHeld
	if write, _ = f.due([]issuer.GrantStatus{held}, grants); len(write) != 1 {
		t.Fatalf("a renewal of a mirrored hold deferred")
	}
	// A grant that ends before its Held is due: only the final status, and nothing remembered.
	c := waiting("c", 2*time.Second)
	grants["c"] = &c
	f.due([]issuer.GrantStatus{{Name: "c", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}}, grants)
	write, _ = f.due([]issuer.GrantStatus{{Name: "c", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased}}}, grants)
	if len(write) != 1 || len(f.since) != 0 {
		t.Fatalf("write %v, remembered %v; want the release and no memory", names(write), f.since)
	}
}

func TestSoonest(t *testing.T) {
	for _, c := range []struct{ a, b, want time.Duration }{
		{0, 0, 0}, {0, 5, 5}, {5, 0, 5}, {3, 5, 3}, {5, 3, 3},
	} {
		if got := soonest(c.a, c.b); got != c.want {
			t.Errorf("soonest(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// A waiter's Pending waits longer than a holder's Held, and each phase's
// delay counts from the first decision that planned that phase: a waiter
// granted after a short wait is not written Held at once because its
// Pending had been deferred.
func TestFreshHoldsDelayPerPhase(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	w := waiting("w", 0)
	grants := map[string]*locksv1.LockGrant{"w": &w}
	pending := issuer.GrantStatus{Name: "w", Status: locksv1.LockGrantStatus{Phase: locksv1.PhasePending}}
	held := issuer.GrantStatus{Name: "w", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}

	if write, wait := f.due([]issuer.GrantStatus{pending}, grants); len(write) != 0 || wait != pendingMirrorDelay {
		t.Fatalf("queued: write %d, wait %v; want nothing for %v", len(write), wait, pendingMirrorDelay)
	}
	now = now.Add(300 * time.Millisecond)
	if write, wait := f.due([]issuer.GrantStatus{pending}, grants); len(write) != 0 || wait != pendingMirrorDelay-300*time.Millisecond {
		t.Fatalf("300 ms later: write %d, wait %v; want nothing yet", len(write), wait)
	}
	// Granted after 300 ms of waiting: the Held waits its own delay.
	now = now.Add(time.Millisecond)
	if write, wait := f.due([]issuer.GrantStatus{held}, grants); len(write) != 0 || wait != heldMirrorDelay {
		t.Fatalf("granted: write %d, wait %v; want nothing for %v", len(write), wait, heldMirrorDelay)
	}
	now = now.Add(heldMirrorDelay)
	if write, _ := f.due([]issuer.GrantStatus{held}, grants); len(write) != 1 {
		t.Fatal("Held not written once due")
	}
	// A wait longer than the Pending delay is mirrored.
	v := waiting("v", time.Second)
	grants["v"] = &v
	f.due([]issuer.GrantStatus{{Name: "v", Status: pending.Status}}, grants)
	now = now.Add(pendingMirrorDelay)
	if write, _ := f.due([]issuer.GrantStatus{{Name: "v", Status: pending.Status}}, grants); len(write) != 1 {
		t.Fatal("a long wait's Pending not written")
	}
}

// Past maxDeferredStatuses deferred statuses (a burst of grants on thousands of
// resources), new ones are written at once, and those already deferred keep
// their time: before, the whole memory was cleared, every deferral restarted
// from zero, the map filled again within the delay, and nothing was ever due
// (the scale bench's 10,000 grants stalled at 5,808 Held, the issuer
// requeueing millions of times).
func TestFreshHoldsBound(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	grants := map[string]*locksv1.LockGrant{}
	held := func(name string) issuer.GrantStatus {
		return issuer.GrantStatus{Name: name, Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}
	}
	var planned []issuer.GrantStatus
	for i := range maxDeferredStatuses {
		name := fmt.Sprintf("g%d", i)
		lg := waiting(name, time.Duration(i))
		grants[name] = &lg
		planned = append(planned, held(name))
	}
	if write, _ := f.due(planned, grants); len(write) != 0 {
		t.Fatalf("%d written at once below the bound", len(write))
	}
	extra := waiting("extra", time.Hour)
	grants["extra"] = &extra
	now = now.Add(heldMirrorDelay / 2)
	if write, _ := f.due([]issuer.GrantStatus{held("extra")}, grants); len(write) != 1 {
		t.Fatal("a status past the bound was deferred")
	}
	now = now.Add(heldMirrorDelay / 2)
	if write, _ := f.due(planned, grants); len(write) != maxDeferredStatuses {
		t.Fatalf("%d of %d deferred statuses due after the delay", len(write), maxDeferredStatuses)
	}
}

// The issuer reconciles on its own registry write before the LockGrant
// informer delivers the status write that followed it. Planned again from
// that stale view, a status already written is not sent again (it would be
// refused for its old resourceVersion: a 409 and a requeue); once the cache
// shows the write, or after landedMemory, the cache decides again.
func TestFreshHoldsLanded(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	a := waiting("a", 0)
	a.ResourceVersion = "10"
	grants := map[string]*locksv1.LockGrant{"a": &a}
	released := func(msg string) issuer.GrantStatus {
		return issuer.GrantStatus{Name: "a", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseReleased,
			Conditions: []metav1.Condition{{Type: locksv1.ConditionIssued, Status: metav1.ConditionFalse, Reason: locksv1.ReasonReleased, Message: msg}}}}
	}
	if write, _ := f.due([]issuer.GrantStatus{released("released at t1")}, grants); len(write) != 1 {
		t.Fatal("a final status not written at once")
	}
	written := a.DeepCopy()
	written.ResourceVersion = "11"
	f.wrote(written, released("released at t1").Status)

	// The stale cache (resourceVersion 10) plans the final status again, with
	// another time in its message: not sent.
	now = now.Add(5 * time.Millisecond)
	if write, _ := f.due([]issuer.GrantStatus{released("released at t2")}, grants); len(write) != 0 {
		t.Fatalf("a final status written twice from a stale cache: %v", write)
	}
	// Another status for the same grant that says something new is sent.
	held := issuer.GrantStatus{Name: "a", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld, ObservedRenewals: 1}}
	b := waiting("b", time.Second)
	b.ResourceVersion, b.Status.Phase = "20", locksv1.PhaseHeld
	grants["b"] = &b
	f.wrote(&locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{UID: b.UID, ResourceVersion: "21"}},
		locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld})
	if write, _ := f.due([]issuer.GrantStatus{{Name: "b", Status: held.Status}}, grants); len(write) != 1 {
		t.Fatal("a renewal's Held skipped as already written")
	}
	if write, _ := f.due([]issuer.GrantStatus{{Name: "b", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}}, grants); len(write) != 0 {
		t.Fatal("the same Held written twice from a stale cache")
	}

	// The cache caught up: the memory goes, and the cache decides.
	a.ResourceVersion = "11"
	if write, _ := f.due([]issuer.GrantStatus{released("released at t3")}, grants); len(write) != 1 {
		t.Fatal("a status planned from a cache that shows the write was skipped")
	}
	if _, ok := f.landed[a.UID]; ok {
		t.Fatal("a landing kept after the cache showed it")
	}
	// A memory older than landedMemory is not trusted: the cache decides.
	now = now.Add(landedMemory + time.Millisecond)
	if write, _ := f.due([]issuer.GrantStatus{{Name: "b", Status: locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld}}}, grants); len(write) != 1 {
		t.Fatal("a landing trusted past landedMemory")
	}
}

func TestNotOwnEcho(t *testing.T) {
	f := newStatusMirror(time.Now)
	pass := notOwnEcho(f)
	a := waiting("a", 0)
	a.ResourceVersion = "10"
	update := func(rv string) event.UpdateEvent {
		n := a.DeepCopy()
		n.ResourceVersion = rv
		return event.UpdateEvent{ObjectOld: &a, ObjectNew: n}
	}
	if !pass.Update(update("11")) {
		t.Fatal("an update skipped before this issuer wrote anything")
	}
	written := a.DeepCopy()
	written.ResourceVersion = "11"
	f.wrote(written, locksv1.LockGrantStatus{Phase: locksv1.PhaseHeld})
	if pass.Update(update("11")) {
		t.Fatal("the echo of our own status write (resourceVersion 11) reconciled")
	}
	// Anything after it (the owner's release, a renewal, someone else's write) passes.
	if !pass.Update(update("12")) {
		t.Fatal("a later change of the LockGrant skipped")
	}
	other := waiting("b", 0)
	other.ResourceVersion = "11"
	if !pass.Update(event.UpdateEvent{ObjectOld: &other, ObjectNew: &other}) {
		t.Fatal("another LockGrant at the same resourceVersion skipped")
	}
	if !pass.Create(event.CreateEvent{Object: written}) || !pass.Delete(event.DeleteEvent{Object: written}) {
		t.Fatal("create or delete events filtered")
	}
}

// A plan made from a view older than this issuer's own write applies on top
// of that write; a view as new or newer, or a write long ago, is left alone.
func TestStatusMirrorRebase(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	view := func(rv string) *locksv1.LockGrant {
		lg := &locksv1.LockGrant{}
		lg.UID, lg.ResourceVersion, lg.Status.Phase = "uid-a", rv, locksv1.PhasePending
		return lg
	}
	written := view("10")
	written.Status.Phase = locksv1.PhaseHeld
	f.wrote(written, written.Status)

	for _, c := range []struct {
		rv, wantRV string
		wantPhase  locksv1.LockGrantPhase
	}{
		{"9", "10", locksv1.PhaseHeld},     // the cache lagged our write: on top of it
		{"12", "12", locksv1.PhasePending}, // someone wrote since: the view stands
		{"x9", "x9", locksv1.PhasePending}, // not comparable
	} {
		lg := view(c.rv)
		f.rebase(lg)
		if lg.ResourceVersion != c.wantRV || lg.Status.Phase != c.wantPhase {
			t.Errorf("view at %s rebased to %s %s, want %s %s", c.rv, lg.ResourceVersion, lg.Status.Phase, c.wantRV, c.wantPhase)
		}
	}
	now = now.Add(landedMemory + time.Second)
	lg := view("9")
	if f.rebase(lg); lg.ResourceVersion != "9" {
		t.Errorf("rebased onto a write %v old", landedMemory)
	}
}

// A finalizer this issuer removed is not removed again while the cache has
// not shown its LockGrant gone; past landedMemory the cache decides again,
// and the memory stays bounded.
func TestStatusMirrorRemembersFinalizerRemovals(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newStatusMirror(func() time.Time { return now })
	if f.finalizerRemoved("uid-a") {
		t.Fatal("a removal remembered before any")
	}
	f.removedFinalizer("uid-a")
	now = now.Add(landedMemory)
	if !f.finalizerRemoved("uid-a") || f.finalizerRemoved("uid-b") {
		t.Fatal("the removal of uid-a is not remembered, or another LockGrant's is")
	}
	now = now.Add(time.Second)
	if f.finalizerRemoved("uid-a") {
		t.Fatalf("a removal remembered past %v", landedMemory)
	}
	for i := range 2 * maxDeferredStatuses {
		f.removedFinalizer(types.UID(fmt.Sprint(i)))
		if i == maxDeferredStatuses {
			now = now.Add(landedMemory + time.Second) // the first ones are old by the bound
		}
	}
	if n := len(f.unfinalized); n > maxDeferredStatuses {
		t.Fatalf("%d removals remembered, bound %d", n, maxDeferredStatuses)
	}
}
