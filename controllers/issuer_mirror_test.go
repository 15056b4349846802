package controllers

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// A decision's writes are planned in the order that matters: the final
// statuses of the grants the registry ended (the holder's, and one whose Held
// never landed), then the new holder, then the bookkeeping, one entry per
// LockGrant with its writes in order (status before finalizer), in the order
// first met.
func TestPlanWritesOrdersEndsBeforeHolderBeforeBookkeeping(t *testing.T) {
	grant := func(name string, phase locksv1.LockGrantPhase) *locksv1.LockGrant {
		lg := &locksv1.LockGrant{}
		lg.Name, lg.UID, lg.Status.Phase = name, types.UID("uid-"+name), phase
		return lg
	}
	byName := map[string]*locksv1.LockGrant{
		"old":       grant("old", locksv1.PhaseHeld),
		"short":     grant("short", locksv1.PhasePending), // ended before its Held landed
		"new":       grant("new", locksv1.PhasePending),
		"waiter":    grant("waiter", ""),
		"twin":      grant("twin", locksv1.PhasePending),
		"cancelled": grant("cancelled", locksv1.PhasePending), // released while waiting: never granted
		"gone":      grant("gone", locksv1.PhasePending),
	}
	status := func(name string, phase locksv1.LockGrantPhase) issuer.GrantStatus {
		return issuer.GrantStatus{Name: name, Status: locksv1.LockGrantStatus{Phase: phase}}
	}
	planned := []issuer.GrantStatus{
		status("twin", locksv1.PhaseDenied), status("short", locksv1.PhaseReleased), status("old", locksv1.PhaseReleased),
		status("cancelled", locksv1.PhaseReleased), status("new", locksv1.PhaseHeld), status("waiter", locksv1.PhasePending),
	}
	d := &issuer.Decision{RemoveFinalizer: []string{"cancelled", "gone", "missing"}}
	d.Status.RecentlyEnded = []locksv1.EndedGrant{{GrantUID: "uid-short"}, {GrantUID: "uid-old"}}
	p := planWrites(planned, d, byName)
	for part, want := range map[string][]string{
		"ends":        {"short:Released", "old:Released"},
		"holder":      {"new:Held"},
		"bookkeeping": {"twin:Denied", "cancelled:Released", "cancelled:finalizer", "waiter:Pending", "gone:finalizer"},
	} {
		got := map[string][]grantWrites{"ends": p.ends, "holder": p.holder, "bookkeeping": p.bookkeeping}[part]
		if w := writeNames(got); !slices.Equal(w, want) {
			t.Errorf("%s %v, want %v", part, w, want)
		}
	}
	if p.ends[1].lg == byName["old"] || p.ends[1].lg.Name != "old" {
		t.Fatal("the plan writes the decision's LockGrant, not its own copy: the decision's whole list stays in memory with it")
	}
	if w := p.bookkeeping[1]; w.lg.Name != "cancelled" || len(w.writes) != 2 {
		t.Fatalf("bookkeeping[1] %s with %d writes, want cancelled's status and finalizer on one copy", w.lg.Name, len(w.writes))
	}
	if len(p.bookkeeping) != 4 {
		t.Fatalf("%d bookkeeping entries, want 4: one per LockGrant, a LockGrant the decision did not read skipped", len(p.bookkeeping))
	}
}

func writeNames(gs []grantWrites) (got []string) {
	for _, g := range gs {
		for _, w := range g.writes {
			kind := "finalizer"
			if w.status != nil {
				kind = string(w.status.Phase)
			}
			got = append(got, g.lg.Name+":"+kind)
		}
	}
	return got
}
