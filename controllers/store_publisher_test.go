package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestDecideStoreStatuses(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	ok := storeOutcome{name: "db", ready: true, reason: locksv1.ReasonStorePublished, message: "fine"}
	down := storeOutcome{name: "db", reason: locksv1.ReasonStoreUnreachable, message: "cannot reach"}

	// A first success: written, but no Event (nothing went wrong).
	next, changes, changed := decideStoreStatuses(nil, []storeOutcome{ok}, t0)
	if !changed || len(changes) != 0 || !next[0].Ready || next[0].LastTransitionTime != t0 {
		t.Fatalf("first success: %+v %+v %v", next, changes, changed)
	}
	// The same again: nothing to write.
	if _, changes, changed := decideStoreStatuses(next, []storeOutcome{ok}, t1); changed || len(changes) != 0 {
		t.Fatalf("unchanged: %+v %v", changes, changed)
	}
	// Down: one change (a Warning), the transition time moves.
	failing, changes, changed := decideStoreStatuses(next, []storeOutcome{down}, t1)
	if !changed || len(changes) != 1 || changes[0].ready || failing[0].LastTransitionTime != t1 {
		t.Fatalf("down: %+v %+v %v", failing, changes, changed)
	}
	// Still down on the next retry: no write, no Event.
	if _, changes, changed := decideStoreStatuses(failing, []storeOutcome{down}, t1); changed || len(changes) != 0 {
		t.Fatalf("still down: %+v %v", changes, changed)
	}
	// Back: one recovery.
	if _, changes, _ := decideStoreStatuses(failing, []storeOutcome{ok}, t1); len(changes) != 1 || !changes[0].ready {
		t.Fatalf("recovered: %+v", changes)
	}
	// A store removed from the spec leaves the status.
	if next, _, changed := decideStoreStatuses(failing, nil, t1); !changed || len(next) != 0 {
		t.Fatalf("removed: %+v %v", next, changed)
	}
	c := storesCondition(failing, 3)
	if c.Status != metav1.ConditionFalse || c.Reason != locksv1.ReasonStoreUnreachable || c.ObservedGeneration != 3 {
		t.Fatalf("condition: %+v", c)
	}
}
