package controllers

import (
	"slices"
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// A handoff's statuses keep their order and are written before anything
// else; the rest of a pass is bookkeeping, one entry per LockGrant with its
// writes in order (status before finalizer), in the order first met.
func TestMirrorSplitsHandoffFromBookkeeping(t *testing.T) {
	grant := func(name string, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
		lg := &locksv1.LockGrant{}
		lg.Name, lg.Status.Phase = name, phase
		return lg
	}
	byName := map[string]*locksv1.LockGrant{
		"old":    grant("old", locksv1.PhaseHeld),
		"new":    grant("new", locksv1.PhasePending),
		"waiter": grant("waiter", ""),
		"twin":   grant("twin", locksv1.PhasePending),
		"gone":   grant("gone", locksv1.PhasePending),
	}
	status := func(name string, phase locksv1.LockGrantPhase) issuer.GrantStatus {
		return issuer.GrantStatus{Name: name, Status: locksv1.LockGrantStatus{Phase: phase}}
	}
	planned := []issuer.GrantStatus{
		status("twin", locksv1.PhaseDenied), status("old", locksv1.PhaseReleased),
		status("new", locksv1.PhaseHeld), status("waiter", locksv1.PhasePending),
	}
	handoff, rest := splitHandoff(planned, byName)
	if got := names(handoff); !slices.Equal(got, []string{"old", "new"}) {
		t.Fatalf("handoff %v, want [old new]: the holder's end, then the new holder", got)
	}
	if got := names(rest); !slices.Equal(got, []string{"twin", "waiter"}) {
		t.Fatalf("rest %v, want [twin waiter]", got)
	}

	d := &issuer.Decision{RemoveFinalizer: []string{"gone", "missing"}, AddFinalizer: []string{"waiter"}}
	writes := bookkeepingWrites(rest, d, byName)
	var got []string
	for _, g := range writes {
		for _, w := range g.writes {
			kind := "finalizer"
			if w.status != nil {
				kind = string(w.status.Phase)
			}
			got = append(got, g.lg.Name+":"+kind)
		}
	}
	want := []string{"twin:Denied", "waiter:Pending", "waiter:finalizer", "gone:finalizer"}
	if !slices.Equal(got, want) {
		t.Fatalf("bookkeeping %v, want %v (one entry per LockGrant, a LockGrant the pass did not read skipped)", got, want)
	}
	if len(writes) != 3 {
		t.Fatalf("%d entries, want 3: one per LockGrant", len(writes))
	}
}

func names(ss []issuer.GrantStatus) (n []string) {
	for _, s := range ss {
		n = append(n, s.Name)
	}
	return n
}
