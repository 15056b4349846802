package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The store publisher's decisions, pure: which grants to end at a store,
// the next status.stores and StoresPublished condition, and the Events.

// storeOutcome is one store's result of a publication.
type storeOutcome struct {
	name string
	// ok: the store took the publication; fence and digest are the holder
	// it now has (0 and "" when nothing is held).
	ok     bool
	fence  int64
	digest string
	// reason and message say why it failed (ok false).
	reason, message string
}

// storeEnd is a grant to end at a store, and why.
type storeEnd struct {
	digest, reason string
}

// endReasonUnknown is the end reason of a grant the registry ended without
// a record of why (recentlyEnded keeps the last 16; the publisher only
// knows the grants it published itself since it started).
const endReasonUnknown = "Ended"

// decideEnds is every grant still open at the store that is not the
// registry's holder, with the reason the registry recorded for it when the
// publisher knows its LockGrant (grantUIDs: digest → LockGrant UID of the
// holders it published), else endReasonUnknown.
func decideEnds(open []string, holder string, grantUIDs map[string]string, recentlyEnded []locksv1.EndedGrant) []storeEnd {
	why := make(map[string]string, len(recentlyEnded))
	for _, e := range recentlyEnded {
		why[e.GrantUID] = e.Reason
	}
	var ends []storeEnd
	for _, d := range open {
		if d == holder {
			continue
		}
		reason := endReasonUnknown
		if r, ok := why[grantUIDs[d]]; ok && grantUIDs[d] != "" && r != "" {
			reason = r
		}
		ends = append(ends, storeEnd{digest: d, reason: reason})
	}
	return ends
}

// storeEvent is an Event to record once the status that explains it is written.
type storeEvent struct {
	store, reason, message string
	warning                bool
}

// decideStoreStatuses is the next status.stores (one entry per outcome, in
// spec order), the Events, and whether anything a reader sees changed.
// A store that keeps failing for the same reason is not rewritten (its
// message may vary from one retry to the next) and raises no new Event.
func decideStoreStatuses(prev []locksv1.StoreStatus, outcomes []storeOutcome, now metav1.Time) ([]locksv1.StoreStatus, []storeEvent, bool) {
	old := make(map[string]locksv1.StoreStatus, len(prev))
	for _, s := range prev {
		old[s.Name] = s
	}
	next := make([]locksv1.StoreStatus, 0, len(outcomes))
	var events []storeEvent
	changed := len(prev) != len(outcomes)
	for i, o := range outcomes {
		p, seen := old[o.name]
		s, ev := nextStoreStatus(p, seen, o, now)
		if ev != nil {
			events = append(events, *ev)
		}
		changed = changed || !seen || i >= len(prev) || prev[i].Name != o.name || !sameStoreStatus(p, s)
		next = append(next, s)
	}
	return next, events, changed
}

// nextStoreStatus is one store's next status, and the Event its change
// raises: a Warning when it starts failing (or fails for another reason),
// StoreRecovered when a failing store takes publications again. A first
// success is no news.
func nextStoreStatus(p locksv1.StoreStatus, seen bool, o storeOutcome, now metav1.Time) (locksv1.StoreStatus, *storeEvent) {
	failing := seen && p.Reason != locksv1.ReasonStorePublished
	if !o.ok {
		s := p
		s.Name = o.name
		if failing && p.Reason == o.reason {
			return s, nil
		}
		s.Reason, s.Message = o.reason, truncate(o.message, 1024)
		return s, &storeEvent{store: o.name, reason: locksv1.EventReasonStorePublishFailed, message: s.Message, warning: true}
	}
	s := locksv1.StoreStatus{Name: o.name, PublishedFence: o.fence, PublishedDigest: o.digest, LastPublishTime: p.LastPublishTime,
		Reason: locksv1.ReasonStorePublished, Message: publishedMessage(o)}
	if !seen || failing || p.PublishedDigest != o.digest || s.LastPublishTime == nil {
		s.LastPublishTime = &now
	}
	if failing {
		return s, &storeEvent{store: o.name, reason: locksv1.EventReasonStoreRecovered,
			message: fmt.Sprintf("the store takes publications again after %s; %s", p.Reason, s.Message)}
	}
	return s, nil
}

func publishedMessage(o storeOutcome) string {
	if o.digest == "" {
		return "nothing is held; every grant of this resource is ended at the store"
	}
	return fmt.Sprintf("the holder (fence %d) is published; every other grant is ended at the store", o.fence)
}

func sameStoreStatus(a, b locksv1.StoreStatus) bool {
	sameTime := (a.LastPublishTime == nil) == (b.LastPublishTime == nil) &&
		(a.LastPublishTime == nil || a.LastPublishTime.Equal(b.LastPublishTime))
	return a.Name == b.Name && a.PublishedFence == b.PublishedFence && a.PublishedDigest == b.PublishedDigest &&
		a.Reason == b.Reason && a.Message == b.Message && sameTime
}

// storesCondition sums the stores up: True when every store has the
// current holder published (or nothing held), else False with the first
// failing store's reason and what to do.
func storesCondition(stores []locksv1.StoreStatus, generation int64) metav1.Condition {
	c := metav1.Condition{Type: locksv1.ConditionStoresPublished, Status: metav1.ConditionTrue, ObservedGeneration: generation,
		Reason: locksv1.ReasonStorePublished, Message: fmt.Sprintf("every store (%d) has what the registry holds", len(stores))}
	failing := 0
	for _, s := range stores {
		if s.Reason == locksv1.ReasonStorePublished {
			continue
		}
		if failing == 0 {
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, s.Reason, fmt.Sprintf("store %s: %s", s.Name, s.Message)
		}
		failing++
	}
	if failing > 1 {
		c.Message = truncate(fmt.Sprintf("%d of %d stores fail; %s", failing, len(stores), c.Message), 32768)
	}
	return c
}

// conditionChanged reports whether setting c would change what a reader sees.
func conditionChanged(conds []metav1.Condition, c metav1.Condition) bool {
	old := meta.FindStatusCondition(conds, c.Type)
	return old == nil || old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message ||
		old.ObservedGeneration != c.ObservedGeneration
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
