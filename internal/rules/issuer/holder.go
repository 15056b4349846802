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

// adoptEpoch moves the registry entry to this issuer's epoch. A new epoch
// cannot know the old leader's clock, so it extends a held lease by one lease
// duration from its takeover.
func adoptEpoch(v *view) []Event {
	in := v.in
	if v.st.IssuerEpoch >= in.Epoch {
		return nil
	}
	v.st.IssuerEpoch = in.Epoch
	h := v.st.Holder
	if h == nil {
		return nil
	}
	ext := in.TakeoverAt.Add(v.lease)
	if !ext.After(h.ExpiresAt.Time) {
		return nil
	}
	h.ExpiresAt = metav1.NewMicroTime(ext)
	return []Event{{h.GrantUID, "Normal", locksv1.EventReasonLeaseExtended,
		fmt.Sprintf("issuer epoch %d took over; lease of fence %d extended to %s", in.Epoch, h.FenceToken, ext.UTC().Format(time.RFC3339))}}
}

// deferIdleAdoption leaves an idle entry (no holder, empty queue) at the
// issuer epoch it has when adopting this issuer's epoch is all the decision
// would write: a takeover or a key rotation then costs a write only for the
// entries someone holds or waits on, not one compare-and-swap per entry, and
// the next write for another reason (an arrival issued, a policy change)
// adopts the epoch. A held lease is still written at once: the acceptance
// webhook judges expiry from the registry holder's expiresAt, so its
// extension must be in the registry, and so is an entry with a queue.
//
// Why an unwritten epoch is safe:
//   - fences are still allocated only by a compare-and-swap on the entry;
//   - a grant carries the issuer's epoch at issue (issueToHead uses
//     Input.Epoch), never the entry's, and revocation (revokedBelowEpoch) and
//     the webhook judge the grant's epoch;
//   - an idle entry has no lease to extend, and the first holder it gets
//     after the takeover is issued by a decision that adopts the epoch;
//   - Superseded (entry epoch above the issuer's) protects an unadopted idle
//     entry no less than before: until a takeover's writes reached it, it was
//     unadopted as well. A deposed issuer still deciding can issue it a grant
//     by compare-and-swap, under its own epoch; that write makes the new
//     issuer decide the entry, find the grant held and adopt it like any held
//     lease, which supersedes the deposed one there. That is what it could do
//     before the takeover's write reached the entry; the window now lasts
//     until the entry is next written rather than until the sweep reached it.
func deferIdleAdoption(v *view) {
	old := &v.in.Resource.Status
	if v.st.IssuerEpoch == old.IssuerEpoch || v.st.Holder != nil || len(v.st.Queue) > 0 {
		return
	}
	kept := v.st
	kept.IssuerEpoch = old.IssuerEpoch
	if equality.Semantic.DeepEqual(kept, *old) {
		v.st.IssuerEpoch = old.IssuerEpoch
	}
}

// GrantFacts is what decides whether, and why, a grant that held has ended.
type GrantFacts struct {
	Gone             bool // its LockGrant no longer exists
	IssuerEpoch      int64
	PolicyGeneration int64
	Deleting         bool // its LockGrant has a deletionTimestamp
	Release          bool // the holder asked to release
	// ExpiresAt is when it expires on the issuer's clock, unless ExpiryUnknown:
	// a grant the registry already let go of is judged without it.
	ExpiresAt     time.Time
	ExpiryUnknown bool
}

// Ending says why a grant ended, or "" while it holds. The order is the
// contract: deletion and revocation win over the client's release, and a
// release only counts if the issuer saw it before expiry.
func Ending(f GrantFacts, revokedBelow, generation int64, now time.Time) (locksv1.LockGrantPhase, string) {
	switch {
	case f.Gone:
		return locksv1.PhaseReleased, locksv1.ReasonDeleted
	case f.IssuerEpoch < revokedBelow:
		return locksv1.PhaseRevoked, locksv1.ReasonRevoked
	case f.PolicyGeneration != generation:
		// The acceptance point refuses grants of an old policy (POLICY_STALE);
		// ending it now hands the resource on instead of letting it idle to expiry.
		return locksv1.PhaseRevoked, locksv1.ReasonPolicyChanged
	case f.Deleting:
		return locksv1.PhaseReleased, locksv1.ReasonDeleted
	case !f.ExpiryUnknown && !now.Before(f.ExpiresAt):
		return locksv1.PhaseExpired, locksv1.ReasonExpired
	case f.Release:
		return locksv1.PhaseReleased, locksv1.ReasonReleased
	}
	return "", ""
}

// settleHolder renews the holder or ends its grant, and returns the terminal
// statuses of the grants that ended (by UID).
func settleHolder(v *view, d *Decision) map[string]locksv1.LockGrantStatus {
	h := v.st.Holder
	if h == nil {
		return nil
	}
	in := v.in
	lg := v.byName[h.GrantName]
	if lg != nil && string(lg.UID) != h.GrantUID {
		lg = nil
	}
	f := GrantFacts{Gone: lg == nil || in.HolderDeleted, IssuerEpoch: h.IssuerEpoch, PolicyGeneration: h.PolicyGeneration, ExpiresAt: h.ExpiresAt.Time}
	if lg != nil {
		f.Deleting, f.Release = lg.DeletionTimestamp != nil, lg.Spec.Release
	}
	phase, reason := Ending(f, in.RevokedBelow, in.Resource.Generation, in.Now)
	if phase == "" {
		renew(v, h, lg)
		return nil
	}
	v.st.Holder = nil
	recordEnded(&v.st, locksv1.EndedGrant{GrantUID: h.GrantUID, Phase: phase, Reason: reason})
	v.endedAt = holderEndedAt(phase, h, lg, in.Now)
	switch phase {
	case locksv1.PhaseExpired:
		d.Counts.Expiries++
	case locksv1.PhaseRevoked:
		d.Counts.Revocations++
	default:
		d.Counts.Releases++
	}
	if reason != locksv1.ReasonReleased { // a voluntary release is routine: no Event
		kind := "Normal"
		if phase != locksv1.PhaseReleased {
			kind = "Warning"
		}
		d.Events = append(d.Events, Event{h.GrantUID, kind, reason,
			fmt.Sprintf("grant with fence %d for %s ended: %s", h.FenceToken, h.Owner, strings.ToLower(string(phase)))})
	}
	return map[string]locksv1.LockGrantStatus{h.GrantUID: TerminalStatus(holderStatus(in.Resource, h), phase, reason, in.Now)}
}

// renew applies a renewal the holder asked for. It counts only because the
// issuer saw it before expiresAt (Ending checked that), and it never shortens
// the lease: after the issuer's clock jumped back, the holder keeps the later
// expiry, and expiresAt stays monotonic.
func renew(v *view, h *locksv1.Holder, lg *locksv1.LockGrant) {
	if lg.Spec.Renewals <= h.ObservedRenewals {
		return
	}
	if renewed := v.in.Now.Add(v.lease); renewed.After(h.ExpiresAt.Time) {
		h.ExpiresAt = metav1.NewMicroTime(renewed)
	}
	h.ObservedRenewals = lg.Spec.Renewals
}

// holderEndedAt estimates when a holder's grant ended, for the handoff time:
// an expiry at expiresAt, a deletion at its deletionTimestamp, a release at
// the LockGrant's last write (managedFields, whole seconds); a revocation, or
// anything unknown, when the issuer sees it. Never after now.
func holderEndedAt(phase locksv1.LockGrantPhase, h *locksv1.Holder, lg *locksv1.LockGrant, now time.Time) time.Time {
	at := now
	switch {
	case phase == locksv1.PhaseExpired:
		at = h.ExpiresAt.Time
	case lg == nil:
	case lg.DeletionTimestamp != nil:
		at = lg.DeletionTimestamp.Time
	case phase == locksv1.PhaseReleased:
		for _, f := range lg.ManagedFields {
			if f.Time != nil && (at.Equal(now) || f.Time.After(at)) {
				at = f.Time.Time
			}
		}
	}
	if at.After(now) {
		return now
	}
	return at
}

// sinceNonNegative is now-t, or 0 when t is later (clocks of two machines).
func sinceNonNegative(now, t time.Time) time.Duration {
	return max(now.Sub(t), 0)
}

// recordEnded keeps the last MaxRecentlyEnded ended grants in the registry,
// written by the compare-and-swap that ends each: the LockGrant mirror that
// says so may never land (a crash right after that compare-and-swap), and a
// LockGrant that never showed Held would then look like a waiting request.
func recordEnded(st *locksv1.FencedResourceStatus, e locksv1.EndedGrant) {
	st.RecentlyEnded = append(slices.Clone(st.RecentlyEnded), e)
	if n := len(st.RecentlyEnded) - locksv1.MaxRecentlyEnded; n > 0 {
		st.RecentlyEnded = st.RecentlyEnded[n:]
	}
}

// endedGrant is the registry's record of lg's grant having ended, if any.
func endedGrant(st *locksv1.FencedResourceStatus, lg *locksv1.LockGrant) (locksv1.EndedGrant, bool) {
	for _, e := range st.RecentlyEnded {
		if e.GrantUID == string(lg.UID) {
			return e, true
		}
	}
	return locksv1.EndedGrant{}, false
}
