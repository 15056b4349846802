package controllers

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// heldMirrorDelay is how long a LockGrant's move to Held waits before it is
// written, and pendingMirrorDelay its move to Pending. Most critical
// sections are shorter than the first and most waits shorter than the
// second: the LockGrant then goes straight to its final status, which
// carries the grant, and an acquire/release cycle costs one LockGrant
// status write instead of two or three. Nothing waits for these writes:
// lockclient is HELD from the registry's holder record, the webhook reads
// only the registry, and a final status (Released, Expired, Revoked,
// Denied) is written at once. Pending waits longer because it says nothing
// the registry's queue does not already show (kubectl fence status), while
// Held is what `kubectl fence acquire` waits for.
const (
	heldMirrorDelay    = 100 * time.Millisecond
	pendingMirrorDelay = time.Second
)

// mirrorDelay is how long a move to phase waits before it is written.
func mirrorDelay(phase locksv1.LockGrantPhase) time.Duration {
	if phase == locksv1.PhasePending {
		return pendingMirrorDelay
	}
	return heldMirrorDelay
}

// maxDeferredStatuses bounds the memory of deferred writes: past it, a new one
// is written at once, and those already deferred keep their time. (Clearing
// the memory instead restarts every deferral, and a burst larger than the
// bound then never comes due.) An entry is forgotten when its status is
// written; one whose LockGrant is never planned again (deleted) is dropped
// once it is staleDeferral old.
const (
	maxDeferredStatuses = 4096
	staleDeferral       = 10 * pendingMirrorDelay
)

// statusMirror decides which planned LockGrant statuses to write now: a move to
// a new non-final phase is deferred for that phase's mirrorDelay of real time
// (the issuer's clock may be injected and stand still), counted from the
// first decision that planned that phase; everything else (final statuses,
// renewals and condition updates within a phase) is written at once.
type statusMirror struct {
	now    func() time.Time
	mu     sync.Mutex
	since  map[types.UID]deferral
	landed map[types.UID]landing
	// unfinalized: LockGrants whose release finalizer this issuer removed,
	// and when. Being deleted, such a LockGrant is gone once the finalizer
	// is; until the cache shows it gone, every decision on its resource
	// plans the removal again (the collector deletes many at once), and
	// sending it would be a 404 or 409 through the LockGrant webhook.
	unfinalized map[types.UID]time.Time
}

// landing is a status this issuer wrote, and the resourceVersion its write
// produced. Until the cache shows that version, a decision made from the
// cache plans the write again (the issuer reconciles on its own registry
// write before the LockGrant informer delivers the status write that
// followed it), and sending it would be refused for its stale
// resourceVersion: a 409, an API write for nothing, and a requeue.
type landing struct {
	resourceVersion string
	status          locksv1.LockGrantStatus
	at              time.Time
}

// landedMemory is how long a landing is trusted over the cache. A cache
// catches up in milliseconds; past this the cache decides again, so a status
// someone else overwrote since is still put right.
const landedMemory = 10 * time.Second

// deferral is a planned phase not yet written, and when it was first planned.
type deferral struct {
	phase locksv1.LockGrantPhase
	first time.Time
}

func newStatusMirror(now func() time.Time) *statusMirror {
	return &statusMirror{now: now, since: map[types.UID]deferral{}, landed: map[types.UID]landing{}, unfinalized: map[types.UID]time.Time{}}
}

// due returns the statuses to write now, in the planned order, and how long
// until the earliest deferred one is due (0 when none is deferred).
func (f *statusMirror) due(planned []issuer.GrantStatus, grants map[string]*locksv1.LockGrant) ([]issuer.GrantStatus, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	f.prune(now)
	var write []issuer.GrantStatus
	var wait time.Duration
	for _, s := range planned {
		if f.alreadyLanded(s, grants[s.Name], now) {
			continue
		}
		left := f.left(s, grants[s.Name], now)
		if left <= 0 {
			write = append(write, s)
			continue
		}
		if wait == 0 || left < wait {
			wait = left
		}
	}
	return write, wait
}

// wrote records that status was written to lg, whose resourceVersion is
// now the one the write produced.
func (f *statusMirror) wrote(lg *locksv1.LockGrant, status locksv1.LockGrantStatus) {
	if lg == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.landed) >= maxDeferredStatuses {
		f.landed = map[types.UID]landing{} // only a saving is lost: the cache decides
	}
	f.landed[lg.UID] = landing{resourceVersion: lg.ResourceVersion, status: status, at: f.now()}
}

// removedFinalizer records that this issuer removed uid's release finalizer.
func (f *statusMirror) removedFinalizer(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if len(f.unfinalized) >= maxDeferredStatuses {
		for u, at := range f.unfinalized {
			if now.Sub(at) > landedMemory {
				delete(f.unfinalized, u)
			}
		}
	}
	if len(f.unfinalized) < maxDeferredStatuses { // else only a saving is lost
		f.unfinalized[uid] = now
	}
}

// finalizerRemoved reports whether this issuer removed uid's release
// finalizer within landedMemory: a removal planned again from a cache that
// has not shown the LockGrant gone is not sent. Past it the cache decides
// again.
func (f *statusMirror) finalizerRemoved(uid types.UID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.unfinalized[uid]
	if ok && f.now().Sub(at) > landedMemory {
		delete(f.unfinalized, uid)
		return false
	}
	return ok
}

// ownEcho reports whether lg is the cache delivering a status write of
// this issuer: its resourceVersion is the one that write produced, so it
// carries nothing the decision that wrote it did not know. A reconcile for
// it would decide the same again; skipping it keeps the resource free for
// the next event that does matter (a release arriving just then waited for
// the echo's reconcile). An echo that arrives before the write's response
// is recorded is not recognized and reconciled as before.
func (f *statusMirror) ownEcho(lg *locksv1.LockGrant) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.landed[lg.UID]
	return ok && l.resourceVersion == lg.ResourceVersion
}

// landedSince reports whether status was written to lg after lg, the view a
// plan was made from.
func (f *statusMirror) landedSince(lg *locksv1.LockGrant, status locksv1.LockGrantStatus) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alreadyLanded(issuer.GrantStatus{Name: lg.Name, Status: status}, lg, f.now())
}

// rebase moves lg, the view a plan was made from, onto the status this
// issuer wrote to it since, when the cache had not shown that write yet: the
// planned write then applies to what is stored instead of failing on the
// older resourceVersion (a Held mirror landing just as its holder releases),
// and a write by anyone else since still fails it.
func (f *statusMirror) rebase(lg *locksv1.LockGrant) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.landed[lg.UID]
	if !ok || f.now().Sub(l.at) > landedMemory || !newerVersion(l.resourceVersion, lg.ResourceVersion) {
		return
	}
	lg.ResourceVersion, lg.Status = l.resourceVersion, *l.status.DeepCopy()
}

// newerVersion reports whether resourceVersion a is known to be newer than
// b. The API server's are etcd revisions; anything else is not compared.
func newerVersion(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// alreadyLanded reports whether s was written already and lg, the cache's
// view, is older than that write: a final status is never written twice,
// and another status only when it says something new.
func (f *statusMirror) alreadyLanded(s issuer.GrantStatus, lg *locksv1.LockGrant, now time.Time) bool {
	if lg == nil {
		return false
	}
	l, ok := f.landed[lg.UID]
	if !ok {
		return false
	}
	if lg.ResourceVersion == l.resourceVersion || now.Sub(l.at) > landedMemory {
		delete(f.landed, lg.UID) // the cache has caught up, or it is trusted again
		return false
	}
	return l.status.Phase.Terminal() || issuer.SameGrantStatus(l.status, s.Status)
}

// left is how long s must still wait (≤ 0: write it now), remembering when
// its phase was first planned and forgetting it once it is due.
func (f *statusMirror) left(s issuer.GrantStatus, lg *locksv1.LockGrant, now time.Time) time.Duration {
	if lg == nil {
		return 0
	}
	if s.Status.Phase.Terminal() || lg.Status.Phase == s.Status.Phase {
		delete(f.since, lg.UID)
		return 0
	}
	d, ok := f.since[lg.UID]
	if !ok || d.phase != s.Status.Phase {
		if !ok && len(f.since) >= maxDeferredStatuses {
			return 0
		}
		d = deferral{phase: s.Status.Phase, first: now}
		f.since[lg.UID] = d
	}
	left := mirrorDelay(d.phase) - now.Sub(d.first)
	if left <= 0 {
		delete(f.since, lg.UID)
	}
	return left
}

// prune drops, at the bound, deferrals of LockGrants never planned again.
func (f *statusMirror) prune(now time.Time) {
	if len(f.since) < maxDeferredStatuses {
		return
	}
	for uid, d := range f.since {
		if now.Sub(d.first) > staleDeferral {
			delete(f.since, uid)
		}
	}
}
