package issuer

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// QueueDelay is how long a new waiter's entry in the registry queue may wait
// for a compare-and-swap the issuer makes anyway (a handoff, a release, an
// expiry) while someone holds the lock. Most waits in a busy queue are
// shorter: the arrival then costs no registry write of its own (0.4–0.5 per
// acquire/release cycle in the contended bench). It is read around the cache
// when first seen either way, and the registry queue shows it after at most
// this long. Shorter than the Pending mirror's delay, so a LockGrant shown
// Pending is in the registry queue.
const QueueDelay = 500 * time.Millisecond

// Arrivals is the issuer's memory of waiting requests whose registry queue
// entry it deferred (QueueDelay).
type Arrivals struct {
	// FirstSeen is when the issuer first saw each, on the caller's real-time
	// clock (Input.SeenNow): FIFO order among them, and the deferral's limit.
	FirstSeen map[types.UID]time.Time
	// Confirmed are the ones a read around the cache found never granted,
	// while the registry was at resourceVersion ConfirmedAt. They stay
	// confirmed as long as it still is: granting anything takes a
	// compare-and-swap that changes it (and a decision from an older view
	// loses its own compare-and-swap).
	ConfirmedAt string
	Confirmed   map[types.UID]bool
	// Since is the registry version the chain of ConfirmedAt began at: the
	// caller moves ConfirmedAt along its own compare-and-swaps (Committed),
	// and reads begun in one chain count only in that chain (Confirm).
	Since string
}

// Committed moves the confirmations across the caller's compare-and-swap
// from registry version from to to. The swap succeeded on from, so nobody
// else wrote in between, and the decision it wrote issued none of the
// arrivals it deferred: what was never granted at from is not at to either.
func (a Arrivals) Committed(from, to string) Arrivals {
	if a.ConfirmedAt != "" && a.ConfirmedAt == from {
		a.ConfirmedAt = to
	}
	return a
}

// Confirm records the arrivals a read around the cache, begun while the
// memory's chain was since, found never granted. A read of another chain
// (the registry changed under someone else's write since) counts for
// nothing: the arrival is read again.
func (a Arrivals) Confirm(since string, neverGranted []types.UID) Arrivals {
	if since == "" || a.Since != since {
		return a
	}
	confirmed := make(map[types.UID]bool, len(a.Confirmed)+len(neverGranted))
	for uid, ok := range a.Confirmed {
		confirmed[uid] = ok
	}
	for _, uid := range neverGranted {
		if _, waiting := a.FirstSeen[uid]; waiting {
			confirmed[uid] = true
		}
	}
	a.Confirmed = confirmed
	return a
}

// chainStart is where the chain of d's confirmations begins: the previous
// decision's chain when this one was made from the version it left, else
// this decision's registry version.
func chainStart(in *Input, d *Decision) string {
	if len(d.Deferred.FirstSeen) == 0 {
		return ""
	}
	if in.Seen.Since != "" && in.Seen.ConfirmedAt == in.Resource.ResourceVersion {
		return in.Seen.Since
	}
	return in.Resource.ResourceVersion
}

// firstSeen is when the issuer first saw lg waiting: now, when it did not before.
func (a *Arrivals) firstSeen(lg *locksv1.LockGrant, now time.Time) time.Time {
	if t, ok := a.FirstSeen[lg.UID]; ok {
		return t
	}
	return now
}

// confirmed reports whether lg was confirmed never granted at the registry version fr has now.
func (a *Arrivals) confirmed(fr *locksv1.FencedResource, lg *locksv1.LockGrant) bool {
	return a.ConfirmedAt != "" && a.ConfirmedAt == fr.ResourceVersion && a.Confirmed[lg.UID]
}

// deferArrivals takes the arrivals rebuildQueue appended back out of the
// status being built when they are all that would change and someone holds
// the lock: the next compare-and-swap (or QueueDelay) brings them in.
// Decision.Deferred remembers them; the caller keeps it for the next decision.
func deferArrivals(v *view, d *Decision, arrivals []*locksv1.LockGrant) {
	in, st := v.in, &v.st
	if len(arrivals) == 0 || st.Holder == nil || in.SeenNow.IsZero() {
		return
	}
	due := time.Duration(0)
	for _, lg := range arrivals {
		left := QueueDelay - in.SeenNow.Sub(in.Seen.firstSeen(lg, in.SeenNow))
		if left <= 0 {
			return
		}
		if due == 0 || left < due {
			due = left
		}
	}
	without := *st.DeepCopy()
	without.Queue = slices.DeleteFunc(without.Queue, func(q locksv1.QueuedGrant) bool {
		return slices.ContainsFunc(arrivals, func(lg *locksv1.LockGrant) bool { return q.GrantName == lg.Name })
	})
	if len(without.Queue) == 0 {
		without.Queue = nil
	}
	if !equality.Semantic.DeepEqual(without, in.Resource.Status) {
		return // the registry is written anyway: they join it now
	}
	*st = without
	// Confirmed is left to DecideConfirmed: only its reads establish it.
	d.Deferred = Arrivals{FirstSeen: map[types.UID]time.Time{}, ConfirmedAt: in.Resource.ResourceVersion}
	for _, lg := range arrivals {
		d.Deferred.FirstSeen[lg.UID] = in.Seen.firstSeen(lg, in.SeenNow)
	}
	if d.RequeueAfter == 0 || due < d.RequeueAfter {
		d.RequeueAfter = due
	}
}

// holdUnconfirmed keeps arrivals only the cache vouches for out of the
// registry queue while someone holds the lock, when the caller confirms
// them outside the decision (Input.ConfirmLater): a decision that read them
// held up every release that came meanwhile, and a tenant queueing on the
// same lock made that most of the operator's share of a handoff. From the
// first unconfirmed arrival on (FIFO), each waits for the caller's reads;
// past QueueDelay they join with reads in the decision, as without it.
func holdUnconfirmed(v *view, d *Decision, arrivals []*locksv1.LockGrant) {
	in, st := v.in, &v.st
	if !in.ConfirmLater || st.Holder == nil || in.SeenNow.IsZero() || len(d.Unconfirmed) == 0 {
		return
	}
	unconfirmed := func(lg *locksv1.LockGrant) bool { return slices.Contains(d.Unconfirmed, lg.Name) }
	// The head this decision issues is confirmed in it: it holds the lock.
	arrivals = slices.DeleteFunc(slices.Clone(arrivals), func(lg *locksv1.LockGrant) bool { return lg.Name == d.IssuedTo })
	first := slices.IndexFunc(arrivals, unconfirmed)
	if first < 0 {
		return
	}
	held := arrivals[first:]
	due, ok := queueDelayLeft(in, held)
	if !ok {
		return // waited long enough: they join now, read in the decision
	}
	st.Queue = slices.DeleteFunc(st.Queue, func(q locksv1.QueuedGrant) bool {
		return slices.ContainsFunc(held, func(lg *locksv1.LockGrant) bool { return q.GrantName == lg.Name })
	})
	if len(st.Queue) == 0 {
		st.Queue = nil
	}
	if d.Deferred.FirstSeen == nil {
		d.Deferred.FirstSeen = map[types.UID]time.Time{}
	}
	d.Deferred.ConfirmedAt = in.Resource.ResourceVersion
	for _, lg := range held {
		d.Deferred.FirstSeen[lg.UID] = in.Seen.firstSeen(lg, in.SeenNow)
		if unconfirmed(lg) {
			d.Confirm = append(d.Confirm, lg.Name)
		}
	}
	d.Unconfirmed = slices.DeleteFunc(d.Unconfirmed, func(name string) bool { return slices.Contains(d.Confirm, name) })
	if d.RequeueAfter == 0 || due < d.RequeueAfter {
		d.RequeueAfter = due
	}
}

// queueDelayLeft is how long until the first of held has waited QueueDelay;
// ok is false when one has already.
func queueDelayLeft(in *Input, held []*locksv1.LockGrant) (time.Duration, bool) {
	due := time.Duration(0)
	for _, lg := range held {
		left := QueueDelay - in.SeenNow.Sub(in.Seen.firstSeen(lg, in.SeenNow))
		if left <= 0 {
			return 0, false
		}
		if due == 0 || left < due {
			due = left
		}
	}
	return due, true
}
