package issuer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// mirrorGrants brings each LockGrant's status in line with the registry
// status being committed. Statuses only move forward, and endings are written
// before the new holder, the holder before waiters.
func mirrorGrants(v *view, d *Decision, ended map[string]locksv1.LockGrantStatus) {
	inQueue := map[string]bool{}
	for _, q := range v.st.Queue {
		inQueue[q.GrantName] = true
	}
	for i := range v.in.Grants {
		if _, deferred := d.Deferred.FirstSeen[v.in.Grants[i].UID]; deferred {
			inQueue[v.in.Grants[i].Name] = true // in the registry queue within QueueDelay
		}
	}
	for i := range v.in.Grants {
		lg := &v.in.Grants[i]
		want, ok := desiredGrantStatus(v, lg, ended, inQueue)
		if ok && !SameGrantStatus(lg.Status, want) {
			d.GrantStatus = append(d.GrantStatus, GrantStatus{lg.Name, want})
			if want.Phase == locksv1.PhaseDenied {
				d.PolicyDenial = true
			}
		}
		if releasesLegacyFinalizer(lg, isHolder(v.st.Holder, lg)) {
			d.RemoveFinalizer = append(d.RemoveFinalizer, lg.Name)
		}
	}
	slices.SortStableFunc(d.GrantStatus, func(a, b GrantStatus) int {
		return statusOrder(a.Status.Phase) - statusOrder(b.Status.Phase)
	})
}

// releasesLegacyFinalizer reports whether lg, being deleted and no longer
// the holder, still carries the release finalizer, which only earlier
// versions put on (the client at create, the issuer on every live request).
// It is no longer needed: a holder whose LockGrant vanishes is ended on an
// uncached read that finds it gone (Input.HolderDeleted), and a waiter that
// vanishes leaves the queue (rebuildQueue). Keeping it cost every acquisition
// one more write through the LockGrant webhook, at collection.
func releasesLegacyFinalizer(lg *locksv1.LockGrant, holds bool) bool {
	return lg.DeletionTimestamp != nil && !holds && slices.Contains(lg.Finalizers, locksv1.GrantFinalizer)
}

// statusOrder puts endings before the new holder, and the holder before waiters.
func statusOrder(p locksv1.LockGrantPhase) int {
	switch {
	case p.Terminal():
		return 0
	case p == locksv1.PhaseHeld:
		return 1
	}
	return 2
}

// desiredGrantStatus returns the status lg should have, and false when lg must
// be left alone (its status is terminal, or our registry view is older than it).
func desiredGrantStatus(v *view, lg *locksv1.LockGrant, ended map[string]locksv1.LockGrantStatus, inQueue map[string]bool) (locksv1.LockGrantStatus, bool) {
	cur, in := lg.Status, v.in
	e, recorded := endedGrant(&v.st, lg)
	switch s, endsNow := ended[string(lg.UID)]; {
	case cur.Phase.Terminal():
		return cur, false
	case endsNow:
		return s, true
	case isHolder(v.st.Holder, lg):
		return holderStatus(in.Resource, v.st.Holder), true
	case recorded && lg.DeletionTimestamp == nil:
		// Its final mirror was lost (or it ended before its Held was written).
		return TerminalStatus(cur, e.Phase, e.Reason, in.Now), true
	case cur.Phase == locksv1.PhaseHeld:
		return formerHolderStatus(v, lg)
	case lg.DeletionTimestamp != nil:
		return cur, false // it disappears (once a legacy finalizer is removed)
	case lg.Spec.Release:
		return TerminalStatus(cur, locksv1.PhaseReleased, locksv1.ReasonReleased, in.Now), true
	}
	if reason, msg := denial(in.Resource, lg, v.served); reason != "" {
		s := *cur.DeepCopy()
		s.Phase = locksv1.PhaseDenied
		SetCondition(&s.Conditions, lg.Generation, locksv1.ConditionIssued, false, reason, msg)
		return s, true
	}
	s := *cur.DeepCopy()
	s.Phase = locksv1.PhasePending
	msg := "waiting in the FIFO queue"
	if !inQueue[lg.Name] {
		msg = fmt.Sprintf("waiting for room in the queue (at most %d waiters)", locksv1.MaxQueueLength)
	}
	SetCondition(&s.Conditions, lg.Generation, locksv1.ConditionIssued, false, locksv1.ReasonQueued, msg)
	return s, true
}

// formerHolderStatus ends a LockGrant that shows Held but that the registry
// no longer names. Only a registry view at least as new as its grant may
// conclude that; an older view is a stale cache. The registry let it go
// earlier, so its expiry is not judged again: with no other reason, it expired.
func formerHolderStatus(v *view, lg *locksv1.LockGrant) (locksv1.LockGrantStatus, bool) {
	cur, in := lg.Status, v.in
	if cur.Grant == nil || v.st.FenceToken < cur.Grant.FenceToken {
		return cur, false
	}
	phase, reason := Ending(GrantFacts{IssuerEpoch: cur.Grant.IssuerEpoch, PolicyGeneration: cur.Grant.PolicyGeneration,
		Deleting: lg.DeletionTimestamp != nil, Release: lg.Spec.Release, ExpiryUnknown: true}, in.RevokedBelow, in.Resource.Generation, in.Now)
	if phase == "" {
		phase, reason = locksv1.PhaseExpired, locksv1.ReasonExpired
	}
	return TerminalStatus(cur, phase, reason, in.Now), true
}

// holderStatus is the LockGrant status that mirrors a holder record.
func holderStatus(fr *locksv1.FencedResource, h *locksv1.Holder) locksv1.LockGrantStatus {
	s := h.HeldStatus(fr.Spec.ResourceID)
	SetCondition(&s.Conditions, 0, locksv1.ConditionIssued, true, locksv1.ReasonIssued,
		fmt.Sprintf("fence %d held until %s", h.FenceToken, h.ExpiresAt.UTC().Format(time.RFC3339Nano)))
	return s
}

// TerminalStatus is cur moved to a final phase, with the reason in its Issued condition.
func TerminalStatus(cur locksv1.LockGrantStatus, phase locksv1.LockGrantPhase, reason string, now time.Time) locksv1.LockGrantStatus {
	s := *cur.DeepCopy()
	s.Phase = phase
	msg := fmt.Sprintf("%s at %s (issuer clock)", strings.ToLower(string(phase)), now.UTC().Format(time.RFC3339Nano))
	SetCondition(&s.Conditions, 0, locksv1.ConditionIssued, false, reason, msg)
	return s
}

// SameGrantStatus reports whether writing want over cur would change nothing
// that matters: it compares statuses ignoring condition transition times, and
// refuses to let a held grant's expiry or renewals move backwards.
func SameGrantStatus(cur, want locksv1.LockGrantStatus) bool {
	if cur.Phase != want.Phase {
		return false // a change of phase, without copies
	}
	a, b := cur.DeepCopy(), want.DeepCopy()
	for i := range a.Conditions {
		a.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	for i := range b.Conditions {
		b.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	if a.Phase == locksv1.PhaseHeld && b.Phase == locksv1.PhaseHeld && a.Grant != nil && b.Grant != nil && *a.Grant == *b.Grant &&
		(b.ObservedRenewals < a.ObservedRenewals || (a.ExpiresAt != nil && b.ExpiresAt != nil && b.ExpiresAt.Before(a.ExpiresAt))) {
		return true // an older registry view; keep what is there
	}
	return equality.Semantic.DeepEqual(a, b)
}
