package controllers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// planInput is everything one issuing decision for one FencedResource depends on.
// planGrants is a pure function of it, so the lease lifecycle can be tested
// without an API server; the reconciler only reads, writes and records.
type planInput struct {
	fr     *locksv1.FencedResource
	grants []locksv1.LockGrant // every LockGrant whose spec.resource names fr
	// holderDeleted is true when the holder's LockGrant was confirmed gone by an uncached read.
	holderDeleted bool
	now           time.Time
	epoch         int64     // this issuer's epoch
	takeoverAt    time.Time // when this issuer's epoch began
	revokedBelow  int64     // trust bundle revokedBelowEpoch
	signer        *grant.Signer
}

// planEvent is an Event to emit once the writes it describes succeeded.
type planEvent struct {
	grant  string // LockGrant UID; "" for an event about the FencedResource only
	kind   string // corev1.EventTypeNormal or Warning
	reason string
	note   string
}

// planOutput is the decision: the new registry status (written by one
// compare-and-swap) and the LockGrant statuses that follow from it.
type planOutput struct {
	status        locksv1.FencedResourceStatus
	statusChanged bool
	// grantStatus lists the LockGrants whose status must change, endings
	// first: written in this order, no two LockGrants ever show Held at once.
	grantStatus []grantStatusChange
	// addFinalizer and removeFinalizer list LockGrant names.
	addFinalizer, removeFinalizer []string
	events                        []planEvent
	requeueAfter                  time.Duration
	// issuedTo is the LockGrant given a new fence; the caller confirms with an
	// uncached read that it was never granted before committing.
	issuedTo string
	// policyDenial is set when a request is denied by the FencedResource's
	// policy; the caller confirms the policy is current before writing it.
	policyDenial bool
	// superseded is set when a newer issuer epoch already wrote this registry
	// entry: this issuer must not decide anything for it.
	superseded                 bool
	issued, handoffs, expiries int
	releases, revocations      int
	// waited is the issued grant's time since its request; handoffGap the
	// time since the previous holder ended (with handoffs > 0).
	waited, handoffGap time.Duration
}

// endedPhase decides why a holder's grant ended, or "" if it still holds.
// Order matters: revocation and deletion win over the client's release, and a
// release or renewal only counts if it arrived before expiry.
func endedPhase(in *planInput, h *locksv1.Holder, lg *locksv1.LockGrant) (locksv1.LockGrantPhase, string) {
	switch {
	case lg == nil || in.holderDeleted:
		return locksv1.PhaseReleased, locksv1.ReasonDeleted
	case h.IssuerEpoch < in.revokedBelow:
		return locksv1.PhaseRevoked, locksv1.ReasonRevoked
	case h.PolicyGeneration != in.fr.Generation:
		// The acceptance point refuses grants of an old policy (POLICY_STALE);
		// ending it now hands the resource on instead of letting it idle to expiry.
		return locksv1.PhaseRevoked, locksv1.ReasonPolicyChanged
	case lg.DeletionTimestamp != nil:
		return locksv1.PhaseReleased, locksv1.ReasonDeleted
	case !in.now.Before(h.ExpiresAt.Time):
		return locksv1.PhaseExpired, locksv1.ReasonExpired
	case lg.Spec.Release:
		return locksv1.PhaseReleased, locksv1.ReasonReleased
	}
	return "", ""
}

// denial returns why a waiting request can never be served, or "".
func denial(fr *locksv1.FencedResource, lg *locksv1.LockGrant, first map[string]string) (string, string) {
	if n := first[lg.Spec.RequestID]; n != lg.Name {
		return locksv1.ReasonDuplicateRequest, fmt.Sprintf("LockGrant %s already carries requestID %q for this resource", n, lg.Spec.RequestID)
	}
	return fr.PolicyViolation(lg.Spec.Owner, lg.Spec.OperationCategory)
}

// arrivedBefore orders requests FIFO by creation, then by name for a stable order.
func arrivedBefore(a, b *locksv1.LockGrant) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// granted reports whether lg holds or ever held a grant.
func granted(fr *locksv1.FencedResource, lg *locksv1.LockGrant) bool {
	return lg.Status.Grant != nil || isHolder(fr.Status.Holder, lg)
}

func isHolder(h *locksv1.Holder, lg *locksv1.LockGrant) bool {
	return h != nil && lg != nil && h.GrantName == lg.Name && h.GrantUID == string(lg.UID)
}

// planGrants computes the next registry state. Invariants it keeps, whatever the input:
// at most one holder; status.fenceToken never decreases; a new fence is
// max(fenceToken, fenceFloor)+1; a LockGrant's phase only moves forward.
func planGrants(in planInput) (planOutput, error) {
	// Times are stored as MicroTime: deciding with the same precision keeps
	// the next reconcile, which reads them back, from seeing a difference and
	// writing every LockGrant status twice.
	in.now = in.now.Truncate(time.Microsecond)
	fr := in.fr
	out := planOutput{}
	st := *fr.Status.DeepCopy()
	lease := time.Duration(fr.Spec.LeaseDurationSeconds) * time.Second

	byName := make(map[string]*locksv1.LockGrant, len(in.grants))
	first := map[string]string{} // requestID -> earliest LockGrant name
	for i := range in.grants {
		byName[in.grants[i].Name] = &in.grants[i]
	}
	// One LockGrant per requestID is served: one that was granted already,
	// otherwise the earliest (the webhook's check can race with a twin create).
	for i := range in.grants {
		lg := &in.grants[i]
		n, ok := first[lg.Spec.RequestID]
		if !ok {
			first[lg.Spec.RequestID] = lg.Name
			continue
		}
		cur := byName[n]
		if granted(fr, cur) != granted(fr, lg) {
			if granted(fr, lg) {
				first[lg.Spec.RequestID] = lg.Name
			}
		} else if arrivedBefore(lg, cur) {
			first[lg.Spec.RequestID] = lg.Name
		}
	}
	if fr.Status.IssuerEpoch > in.epoch {
		out.superseded = true
		return out, nil
	}

	// A new issuer epoch cannot know the old leader's clock, so it extends held
	// leases by one lease duration from its takeover.
	if st.IssuerEpoch < in.epoch {
		if h := st.Holder; h != nil {
			if ext := in.takeoverAt.Add(lease); ext.After(h.ExpiresAt.Time) {
				h.ExpiresAt = metav1.NewMicroTime(ext)
				out.events = append(out.events, planEvent{h.GrantUID, "Normal", "LeaseExtended",
					fmt.Sprintf("issuer epoch %d took over; lease of fence %d extended to %s", in.epoch, h.FenceToken, ext.UTC().Format(time.RFC3339))})
			}
		}
		st.IssuerEpoch = in.epoch
	}

	// The holder: renew, or end it.
	ended := map[string]locksv1.LockGrantStatus{}
	handoff := false
	var endedAt time.Time
	if h := st.Holder; h != nil {
		lg := byName[h.GrantName]
		if lg != nil && string(lg.UID) != h.GrantUID {
			lg = nil
		}
		if phase, reason := endedPhase(&in, h, lg); phase != "" {
			ended[h.GrantUID] = terminalStatus(holderStatus(fr, h), phase, reason, in.now)
			st.Holder = nil
			handoff = true
			endedAt = holderEndedAt(phase, h, lg, in.now)
			switch phase {
			case locksv1.PhaseExpired:
				out.expiries++
			case locksv1.PhaseRevoked:
				out.revocations++
			default:
				out.releases++
			}
			kind := "Normal"
			if phase != locksv1.PhaseReleased {
				kind = "Warning"
			}
			out.events = append(out.events, planEvent{h.GrantUID, kind, reason,
				fmt.Sprintf("grant with fence %d for %s ended: %s", h.FenceToken, h.Owner, strings.ToLower(string(phase)))})
		} else if lg.Spec.Renewals > h.ObservedRenewals {
			// A renewal counts only if the issuer sees it before expiresAt (checked above).
			// It never shortens the lease: after the issuer's clock jumped back,
			// the holder keeps the later expiry, and expiresAt stays monotonic.
			if renewed := in.now.Add(lease); renewed.After(h.ExpiresAt.Time) {
				h.ExpiresAt = metav1.NewMicroTime(renewed)
			}
			h.ObservedRenewals = lg.Spec.Renewals
		}
	}

	// The queue: drop entries that can no longer be served, append new arrivals.
	queued := map[string]bool{}
	keep := st.Queue[:0:0]
	for _, q := range st.Queue {
		lg := byName[q.GrantName]
		if lg == nil || lg.DeletionTimestamp != nil || lg.Spec.Release || lg.Status.Phase.Terminal() || isHolder(st.Holder, lg) || lg.Status.Grant != nil {
			continue
		}
		if r, _ := denial(fr, lg, first); r != "" {
			continue
		}
		keep = append(keep, q)
		queued[q.GrantName] = true
	}
	var arrivals []*locksv1.LockGrant
	for i := range in.grants {
		lg := &in.grants[i]
		if queued[lg.Name] || isHolder(st.Holder, lg) || isHolder(fr.Status.Holder, lg) || lg.DeletionTimestamp != nil ||
			lg.Spec.Release || lg.Status.Grant != nil || lg.Status.Phase == locksv1.PhaseHeld || lg.Status.Phase.Terminal() {
			continue
		}
		if r, _ := denial(fr, lg, first); r != "" {
			continue
		}
		arrivals = append(arrivals, lg)
	}
	slices.SortFunc(arrivals, func(a, b *locksv1.LockGrant) int {
		if arrivedBefore(a, b) {
			return -1
		}
		return 1
	})
	for _, lg := range arrivals {
		if len(keep) >= locksv1.MaxQueueLength {
			break
		}
		keep = append(keep, locksv1.QueuedGrant{GrantName: lg.Name, Owner: lg.Spec.Owner})
	}
	st.Queue = keep
	if len(st.Queue) == 0 {
		st.Queue = nil
	}

	// Issue to the head of the queue. The fence is allocated here and becomes
	// real only if the caller's compare-and-swap on fr's resourceVersion succeeds.
	epochRevoked := in.epoch < in.revokedBelow
	if st.Holder == nil && len(st.Queue) > 0 && !epochRevoked {
		head := byName[st.Queue[0].GrantName]
		st.Queue = st.Queue[1:]
		if len(st.Queue) == 0 {
			st.Queue = nil
		}
		fence := max(st.FenceToken, fr.Spec.FenceFloor) + 1
		now := in.now.UTC()
		h := &locksv1.Holder{
			GrantName: head.Name, GrantUID: string(head.UID), Owner: head.Spec.Owner,
			Lease: head.Spec.Lease, RequestID: head.Spec.RequestID, FenceToken: fence,
			OperationRoot: head.Spec.OperationRoot, OperationCategory: head.Spec.OperationCategory,
			IssuerEpoch: in.epoch, PolicyGeneration: fr.Generation, BackendRevision: fr.ResourceVersion,
			TTLSeconds: int64(fr.Spec.LeaseDurationSeconds), IssuedAt: now.Format(time.RFC3339Nano),
			ExpiresAt: metav1.NewMicroTime(now.Add(lease)), ObservedRenewals: head.Spec.Renewals,
		}
		digest, proof, err := in.signer.Sign(h.Grant(fr.Spec.ResourceID))
		if err != nil {
			return out, fmt.Errorf("sign grant for %s: %w", head.Name, err)
		}
		h.Digest, h.Proof = digest, proof
		st.Holder = h
		st.FenceToken = fence
		st.BackendRevision = fr.ResourceVersion
		out.issued++
		out.issuedTo = head.Name
		out.waited = sinceNonNegative(in.now, head.CreationTimestamp.Time)
		reason, note := "Issued", fmt.Sprintf("fence %d issued to %s (lease %s)", fence, h.Owner, h.Lease)
		if handoff {
			out.handoffs++
			out.handoffGap = sinceNonNegative(in.now, endedAt)
			reason = "HandedOff"
			note = fmt.Sprintf("handed off to %s with fence %d", h.Owner, fence)
		}
		out.events = append(out.events, planEvent{string(head.UID), "Normal", reason, note})
	}
	st.PolicyGeneration = fr.Generation

	// Conditions.
	if epochRevoked {
		setCondition(&st.Conditions, fr.Generation, locksv1.ConditionReady, false, locksv1.ReasonEpochRevoked,
			fmt.Sprintf("issuer epoch %d is below the trust bundle's revokedBelowEpoch %d; no grant can be issued until a new issuer epoch takes over", in.epoch, in.revokedBelow))
	} else {
		// No epoch in the message: two issuers must not flap it between them.
		setCondition(&st.Conditions, fr.Generation, locksv1.ConditionReady, true, locksv1.ReasonIssuing, "grants are issued")
	}
	// A fence regression ends when an operator raised fenceFloor to at least
	// the highest fence the target accepted; the issuer never lowers that fence.
	if c := meta.FindStatusCondition(st.Conditions, locksv1.ConditionFenceRegression); c != nil && c.Status == metav1.ConditionTrue &&
		fr.Spec.FenceFloor >= st.HighestObservedFence {
		setCondition(&st.Conditions, fr.Generation, locksv1.ConditionFenceRegression, false, locksv1.ReasonFloorAboveTarget,
			fmt.Sprintf("spec.fenceFloor %d is at or above the highest fence seen at the target (%d); new grants are issued above it", fr.Spec.FenceFloor, st.HighestObservedFence))
	}
	if h := st.Holder; h != nil {
		setCondition(&st.Conditions, fr.Generation, locksv1.ConditionHeld, true, locksv1.ReasonHolderActive,
			fmt.Sprintf("%s holds fence %d", h.Owner, h.FenceToken))
		out.requeueAfter = max(h.ExpiresAt.Sub(in.now), time.Millisecond)
	} else {
		setCondition(&st.Conditions, fr.Generation, locksv1.ConditionHeld, false, locksv1.ReasonNoHolder, "no grant is held")
	}
	out.status = st
	out.statusChanged = !equality.Semantic.DeepEqual(st, fr.Status)

	// LockGrant statuses follow from the registry; they only move forward.
	inQueue := map[string]bool{}
	for _, q := range st.Queue {
		inQueue[q.GrantName] = true
	}
	for i := range in.grants {
		lg := &in.grants[i]
		want, ok := desiredGrantStatus(&in, st, lg, ended, inQueue, first)
		if ok && !sameGrantStatus(lg.Status, want) {
			out.grantStatus = append(out.grantStatus, grantStatusChange{lg.Name, want})
			if want.Phase == locksv1.PhaseDenied {
				out.policyDenial = true
			}
		}
		switch {
		case lg.DeletionTimestamp != nil && !isHolder(st.Holder, lg) && slices.Contains(lg.Finalizers, locksv1.GrantFinalizer):
			out.removeFinalizer = append(out.removeFinalizer, lg.Name)
		case lg.DeletionTimestamp == nil && !lg.Status.Phase.Terminal() && !slices.Contains(lg.Finalizers, locksv1.GrantFinalizer):
			if _, endsNow := ended[string(lg.UID)]; !endsNow {
				out.addFinalizer = append(out.addFinalizer, lg.Name)
			}
		}
	}
	slices.SortStableFunc(out.grantStatus, func(a, b grantStatusChange) int {
		return statusOrder(a.status.Phase) - statusOrder(b.status.Phase)
	})
	return out, nil
}

type grantStatusChange struct {
	name   string
	status locksv1.LockGrantStatus
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
func desiredGrantStatus(in *planInput, st locksv1.FencedResourceStatus, lg *locksv1.LockGrant,
	ended map[string]locksv1.LockGrantStatus, inQueue map[string]bool, first map[string]string) (locksv1.LockGrantStatus, bool) {
	cur := lg.Status
	if cur.Phase.Terminal() {
		return cur, false
	}
	if s, ok := ended[string(lg.UID)]; ok {
		return s, true
	}
	if isHolder(st.Holder, lg) {
		return holderStatus(in.fr, st.Holder), true
	}
	if cur.Phase == locksv1.PhaseHeld {
		// It held once and no longer does. Only conclude that from a registry
		// view at least as new as its grant; an older view is a stale cache.
		if cur.Grant == nil || st.FenceToken < cur.Grant.FenceToken {
			return cur, false
		}
		phase, reason := locksv1.PhaseExpired, locksv1.ReasonExpired
		switch {
		case cur.Grant.IssuerEpoch < in.revokedBelow:
			phase, reason = locksv1.PhaseRevoked, locksv1.ReasonRevoked
		case cur.Grant.PolicyGeneration != in.fr.Generation:
			phase, reason = locksv1.PhaseRevoked, locksv1.ReasonPolicyChanged
		case lg.DeletionTimestamp != nil:
			phase, reason = locksv1.PhaseReleased, locksv1.ReasonDeleted
		case lg.Spec.Release:
			phase, reason = locksv1.PhaseReleased, locksv1.ReasonReleased
		}
		return terminalStatus(cur, phase, reason, in.now), true
	}
	// Pending or new.
	if lg.DeletionTimestamp != nil {
		return cur, false // it disappears once the finalizer is removed
	}
	if lg.Spec.Release {
		return terminalStatus(cur, locksv1.PhaseReleased, locksv1.ReasonReleased, in.now), true
	}
	if reason, msg := denial(in.fr, lg, first); reason != "" {
		s := *cur.DeepCopy()
		s.Phase = locksv1.PhaseDenied
		setCondition(&s.Conditions, lg.Generation, locksv1.ConditionIssued, false, reason, msg)
		return s, true
	}
	s := *cur.DeepCopy()
	s.Phase = locksv1.PhasePending
	msg := "waiting in the FIFO queue"
	if !inQueue[lg.Name] {
		msg = fmt.Sprintf("waiting for room in the queue (at most %d waiters)", locksv1.MaxQueueLength)
	}
	setCondition(&s.Conditions, lg.Generation, locksv1.ConditionIssued, false, locksv1.ReasonQueued, msg)
	return s, true
}

// holderStatus is the LockGrant status that mirrors a holder record.
func holderStatus(fr *locksv1.FencedResource, h *locksv1.Holder) locksv1.LockGrantStatus {
	exp := h.ExpiresAt
	s := locksv1.LockGrantStatus{
		Phase:            locksv1.PhaseHeld,
		Grant:            locksv1.DocumentFromGrant(h.Grant(fr.Spec.ResourceID)),
		Digest:           h.Digest,
		Proof:            h.Proof,
		ExpiresAt:        &exp,
		ObservedRenewals: h.ObservedRenewals,
	}
	setCondition(&s.Conditions, 0, locksv1.ConditionIssued, true, locksv1.ReasonIssued,
		fmt.Sprintf("fence %d held until %s", h.FenceToken, h.ExpiresAt.UTC().Format(time.RFC3339Nano)))
	return s
}

func terminalStatus(cur locksv1.LockGrantStatus, phase locksv1.LockGrantPhase, reason string, now time.Time) locksv1.LockGrantStatus {
	s := *cur.DeepCopy()
	s.Phase = phase
	msg := fmt.Sprintf("%s at %s (issuer clock)", strings.ToLower(string(phase)), now.UTC().Format(time.RFC3339Nano))
	setCondition(&s.Conditions, 0, locksv1.ConditionIssued, false, reason, msg)
	return s
}

// sameGrantStatus compares statuses ignoring condition transition times, and
// refuses to let a held grant's expiry or renewals move backwards.
func sameGrantStatus(cur, want locksv1.LockGrantStatus) bool {
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

// setCondition sets a condition, keeping its transition time when the status did not change.
func setCondition(conds *[]metav1.Condition, gen int64, typ string, ok bool, reason, msg string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}

// PlanInput is the exported form of one issuing decision's inputs. It exists
// so that the deterministic simulator (test/sim) drives this planner, not a
// copy of its rules, against an in-memory registry.
type PlanInput struct {
	FencedResource *locksv1.FencedResource
	Grants         []locksv1.LockGrant // every LockGrant whose spec.resource names the FencedResource
	HolderDeleted  bool
	Now            time.Time
	Epoch          int64
	TakeoverAt     time.Time
	RevokedBelow   int64
	Signer         *grant.Signer
}

// PlanResult is what the reconciler writes after one plan: the registry
// status (one compare-and-swap), then the LockGrant statuses in order.
type PlanResult struct {
	Status          locksv1.FencedResourceStatus
	StatusChanged   bool
	GrantStatus     []GrantStatusUpdate
	AddFinalizer    []string
	RemoveFinalizer []string
	IssuedTo        string
	Superseded      bool
	RequeueAfter    time.Duration
}

// GrantStatusUpdate is the new status of the LockGrant named Name.
type GrantStatusUpdate struct {
	Name   string
	Status locksv1.LockGrantStatus
}

// Plan runs the planner on in. It is pure: in is not modified.
func Plan(in PlanInput) (PlanResult, error) {
	out, err := planGrants(planInput{
		fr: in.FencedResource, grants: in.Grants, holderDeleted: in.HolderDeleted, now: in.Now,
		epoch: in.Epoch, takeoverAt: in.TakeoverAt, revokedBelow: in.RevokedBelow, signer: in.Signer,
	})
	if err != nil {
		return PlanResult{}, err
	}
	res := PlanResult{Status: out.status, StatusChanged: out.statusChanged, AddFinalizer: out.addFinalizer,
		RemoveFinalizer: out.removeFinalizer, IssuedTo: out.issuedTo, Superseded: out.superseded, RequeueAfter: out.requeueAfter}
	for _, c := range out.grantStatus {
		res.GrantStatus = append(res.GrantStatus, GrantStatusUpdate{Name: c.name, Status: c.status})
	}
	return res, nil
}
