// Package issuer is the issuer's decision for one FencedResource: given the
// registry entry, its LockGrants and the issuer's clock, epoch and key, what
// the registry and each LockGrant must say next. It is pure (no API calls,
// no clock of its own), so the lease lifecycle is tested without a server and
// the simulator (test/sim) drives these rules, not a copy of them.
//
// Decide runs named steps in this order, each a small function with its own test:
//
//  1. servedRequests: one LockGrant per owner and requestID is served.
//     (A registry already under a newer issuer epoch: Superseded, nothing decided.)
//  2. adoptEpoch: a newer issuer epoch takes over and extends held leases
//     (an idle entry adopts it lazily, see step 8).
//  3. settleHolder: the holder renews, or its grant ends (Ending says why).
//  4. rebuildQueue: drop requests that can no longer be served, append
//     arrivals FIFO (each to be confirmed by the caller, see Decision.Unconfirmed).
//  5. issueToHead: the head of the queue gets the next fence, signed.
//  6. setConditions: Ready, FenceRegression, Held.
//  7. deferArrivals: while someone holds the lock and arrivals are all that
//     would change, they stay out of the committed queue until the next
//     compare-and-swap or QueueDelay (Decision.Deferred), so a burst costs one write.
//     holdUnconfirmed: with Input.ConfirmLater, while someone holds the
//     lock, arrivals not yet confirmed stay out of it until the caller's
//     reads confirm them (Decision.Confirm), so no decision waits for them.
//  8. deferIdleAdoption: an idle entry (no holder, empty queue) whose only
//     change would be the new issuer epoch is not written; its next write
//     for another reason adopts the epoch, so a takeover writes only the
//     entries someone holds or waits on.
//  9. mirrorGrants: the LockGrant statuses that follow (and the removal of
//     the release finalizer earlier versions put on LockGrants).
//
// The caller commits Decision.Status with one compare-and-swap on the
// FencedResource's resourceVersion; only then are the fence and every other
// decision real. It decides from its cache, except while the cache still
// shows a version its own last compare-and-swap replaced: then from what
// that swap wrote (OwnWrites), since a decision from the older version
// repeats the swap and can only lose.
package issuer

import (
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Input is everything one decision depends on.
type Input struct {
	Resource *locksv1.FencedResource
	// Grants are the LockGrants whose spec.resource names Resource and that
	// are Active; ended ones may be included and change nothing.
	Grants []locksv1.LockGrant
	// HolderDeleted is true when the holder's LockGrant was confirmed gone by an uncached read.
	HolderDeleted bool
	Now           time.Time
	Epoch         int64     // this issuer's epoch
	TakeoverAt    time.Time // when this issuer's epoch began
	RevokedBelow  int64     // the trust bundle's revokedBelowEpoch
	Signer        *grant.Signer
	// Seen is what the previous decision for this resource deferred
	// (Decision.Deferred); SeenNow the real time it is measured on (zero:
	// defer nothing).
	Seen    Arrivals
	SeenNow time.Time
	// ConfirmLater: the caller confirms arrivals outside the decision
	// (Decision.Confirm), so that while someone holds the lock a decision
	// never waits for those reads.
	ConfirmLater bool
	// CreationVersion is the resourceVersion a LockGrant had when the
	// caller first received it (ok false: it cannot tell), its creation's
	// unless it was changed since (by its owner, or break-glass). Versions
	// of one resource are comparable, so this orders requests created in
	// the same second, which creationTimestamp (whole seconds) cannot.
	// Nil: such requests are ordered by name.
	CreationVersion func(types.UID) (rv uint64, ok bool)
}

// Event is an Event to emit once the writes it describes succeeded.
type Event struct {
	GrantUID string // "" for an event about the FencedResource only
	Type     string // corev1.EventTypeNormal or Warning
	Reason   string
	Note     string
}

// GrantStatus is the new status of the LockGrant named Name.
type GrantStatus struct {
	Name   string
	Status locksv1.LockGrantStatus
}

// Counts are what the decision did, for metrics.
type Counts struct {
	Issued, Handoffs, Expiries, Releases, Revocations int
	// Waited is the issued grant's time since its request; HandoffGap the
	// time since the previous holder ended (when Handoffs > 0).
	Waited, HandoffGap time.Duration
}

// Decision is the next registry status (one compare-and-swap) and the
// LockGrant changes that follow from it.
type Decision struct {
	Status        locksv1.FencedResourceStatus
	StatusChanged bool
	// GrantStatus lists the LockGrants whose status must change, endings
	// first: written in this order, no two LockGrants ever show Held at once.
	GrantStatus []GrantStatus
	// RemoveFinalizer lists the LockGrants being deleted whose release
	// finalizer (locksv1.GrantFinalizer, put on by earlier versions) must go.
	RemoveFinalizer []string
	Events          []Event
	// RequeueAfter is when to decide again (an expiry, a deferral), counted
	// from the decision; a caller that acts on it later takes the time
	// since off (0: no need).
	RequeueAfter time.Duration
	// IssuedTo is the LockGrant given a new fence.
	IssuedTo string
	// Unconfirmed lists the LockGrants this decision trusts the cache about
	// for the first time: arrivals it queues, and a head it issues that was
	// not queued under its UID. Before committing, the caller confirms with a
	// read around its cache that each was never granted (a cache that missed
	// an earlier grant must not earn a LockGrant a second fence), and decides
	// again from what it read when one was. A head confirmed when it was
	// queued is issued without a read: the handoff's critical path.
	Unconfirmed []string
	// Confirm lists the arrivals held out of the registry queue until the
	// caller has read them around its cache (Input.ConfirmLater); it records
	// what it read with Arrivals.Confirm and decides again.
	Confirm []string
	// Deferred are the arrivals left out of the registry queue for now
	// (QueueDelay), to pass back as Input.Seen: a caller that commits this
	// decision keeps it, one that loses the compare-and-swap drops it.
	Deferred Arrivals
	// PolicyDenial is set when a request is denied by the FencedResource's
	// policy; the caller confirms the policy is current before writing it.
	PolicyDenial bool
	// Superseded is set when a newer issuer epoch already wrote this registry
	// entry: this issuer must not decide anything for it.
	Superseded bool
	Counts     Counts
}

// view is the decision in progress: the input indexed, and the status being built.
type view struct {
	in     *Input
	byName map[string]*locksv1.LockGrant
	served map[requestKey]string // owner and requestID -> the LockGrant served for them
	st     locksv1.FencedResourceStatus
	lease  time.Duration
	// endedAt is when the holder's grant ended, when settleHolder ended it.
	endedAt time.Time
}

// Decide computes the next registry state. Invariants it keeps, whatever the
// input: at most one holder; status.fenceToken never decreases; a new fence
// is max(fenceToken, fenceFloor)+1; a LockGrant's phase only moves forward.
func Decide(in Input) (Decision, error) {
	// Times are stored as MicroTime: deciding with the same precision keeps
	// the next reconcile, which reads them back, from seeing a difference and
	// writing every LockGrant status twice.
	in.Now = in.Now.Truncate(time.Microsecond)
	fr := in.Resource
	v := &view{in: &in, byName: make(map[string]*locksv1.LockGrant, len(in.Grants)),
		st: *fr.Status.DeepCopy(), lease: time.Duration(fr.Spec.LeaseDurationSeconds) * time.Second}
	for i := range in.Grants {
		v.byName[in.Grants[i].Name] = &in.Grants[i]
	}
	v.served = servedRequests(&in)
	var d Decision
	if fr.Status.IssuerEpoch > in.Epoch {
		d.Superseded = true
		return d, nil
	}
	d.Events = append(d.Events, adoptEpoch(v)...)
	ended := settleHolder(v, &d)
	arrivals := rebuildQueue(v, &d)
	if err := issueToHead(v, &d, len(ended) > 0); err != nil {
		return Decision{}, err
	}
	v.st.PolicyGeneration = fr.Generation
	d.RequeueAfter = setConditions(v)
	deferArrivals(v, &d, arrivals)
	holdUnconfirmed(v, &d, arrivals)
	d.Deferred.Since = chainStart(&in, &d)
	deferIdleAdoption(v)
	d.Status = v.st
	d.StatusChanged = !equality.Semantic.DeepEqual(v.st, fr.Status)
	mirrorGrants(v, &d, ended)
	return d, nil
}
