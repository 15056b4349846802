package controllers

import (
	"cmp"
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// DefaultEndedGrantRetention is how long an ended LockGrant is kept by default.
const DefaultEndedGrantRetention = time.Hour

// DefaultEndedGrantMaxCount is how many ended LockGrants are kept by default,
// however recent. The retention bounds their number only through the
// acquisition rate: at 50 acquisitions a second an hour is 180,000 ended
// LockGrants, and once etcd reaches its quota (2 GiB by default) the API
// server refuses every write, grants included. The count bounds the history
// whatever the rate; 50,000 is an hour at about 14 acquisitions a second.
const DefaultEndedGrantMaxCount = 50_000

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants,verbs=delete

// EndedGrantCollector deletes LockGrants that have been ended (Released,
// Expired, Revoked, Denied) for longer than Retention, or, the oldest first,
// those beyond the newest MaxCount ended, so that neither etcd nor every
// replica's cache grows with each acquisition ever made. A LockGrant that
// records a write whose outcome is unknown is kept until that record is
// resolved: it is what ReconciliationRequired points an on-call person to.
// Deleting an ended LockGrant changes no decision (issuer.Active); its
// requestID may then be used again by a new request.
//
// The time is counted from when this replica first saw the LockGrant
// collectable (the API has no end time but the condition's message), on
// Clock. The collector never lists LockGrants: an informer event handler
// keeps the collectable ones in an index ordered by that time (endedIndex),
// and a pass looks only at the entries that are due.
type EndedGrantCollector struct {
	// Client reads LockGrants from the manager's cache and deletes them.
	Client    client.Client
	Clock     clock.Clock
	Retention time.Duration // positive
	MaxCount  int           // negative: no bound by count

	index endedIndex
	// wake asks for a pass before the next tick: more than MaxCount are tracked.
	wake chan struct{}
}

// SetupWithManager registers the collector's event handler on the manager's
// LockGrant informer and adds the collector to mgr.
//
// The handler runs on every replica, so each keeps its own index of what it
// has seen ended; only the leader's Start deletes (NeedLeaderElection). A
// standby's index costs one small entry per collectable LockGrant its cache
// holds, and a standby that becomes leader keeps counting from its own
// sightings instead of starting afresh.
func (c *EndedGrantCollector) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	informer, err := mgr.GetCache().GetInformer(ctx, &locksv1.LockGrant{})
	if err != nil {
		return err
	}
	c.wake = make(chan struct{}, 1)
	if _, err := informer.AddEventHandler(c.handler()); err != nil {
		return err
	}
	return mgr.Add(c)
}

// handler keeps the index in step with the cache, one event at a time.
func (c *EndedGrantCollector) handler() toolscache.ResourceEventHandler {
	observe := func(obj any) {
		lg, ok := obj.(*locksv1.LockGrant)
		if !ok {
			return
		}
		if n := c.index.observe(lg, c.Clock.Now()); c.MaxCount >= 0 && n > c.MaxCount {
			c.wakeUp()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			if lg, ok := obj.(*locksv1.LockGrant); ok {
				c.index.forget(lg.UID, nil)
			}
		},
	}
}

// wakeUp asks for a pass without waiting for one (a pass soon covers every
// request made meanwhile).
func (c *EndedGrantCollector) wakeUp() {
	if c.wake == nil {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is true: one replica collects.
func (c *EndedGrantCollector) NeedLeaderElection() bool { return true }

// Start collects every Retention/4 (at least every second, at most every
// minute), and as soon as more than MaxCount ended LockGrants are tracked,
// until ctx ends.
func (c *EndedGrantCollector) Start(ctx context.Context) error {
	interval := min(max(c.Retention/4, time.Second), time.Minute)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.wake:
		}
		if err := c.collect(ctx); err != nil && ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "collecting ended LockGrants")
		}
		// A wake-up asks again at every event while over the count; at
		// most one pass a second, so failing deletes do not run hot.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(minPassInterval):
		}
	}
}

// minPassInterval is the least time between two passes.
const minPassInterval = time.Second

// collect runs one pass over the entries that are due, oldest first. An
// entry whose delete fails stays due and the pass goes on with the others:
// one LockGrant the API server refuses to delete does not keep the rest.
// It returns the first error.
func (c *EndedGrantCollector) collect(ctx context.Context) error {
	var first error
	for _, e := range c.index.due(c.Clock.Now(), c.Retention, c.MaxCount) {
		if err := c.collectOne(ctx, e); err != nil {
			if ctx.Err() != nil {
				return err
			}
			first = cmp.Or(first, err)
		}
	}
	return first
}

// collectOne deletes the LockGrant of a due entry if the cache still holds it
// collectable, and forgets the entry unless the delete was refused for a
// newer resourceVersion (then it is due again next pass).
func (c *EndedGrantCollector) collectOne(ctx context.Context, e *endedEntry) error {
	var lg locksv1.LockGrant
	// Read only: the cache's object is not copied.
	err := c.Client.Get(ctx, e.key, &lg, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
		c.index.forget(e.uid, e)
		return nil
	case err != nil:
		return err
	}
	if lg.UID != e.uid || !collectable(&lg) {
		// Gone and replaced by a namesake, or no longer collectable: the
		// handler forgets it too, and a LockGrant that becomes collectable
		// again counts from then.
		c.index.forget(e.uid, e)
		return nil
	}
	// Preconditions: an owner who annotated an unresolved write (or
	// anything else) since the cache saw it keeps the LockGrant.
	uid, rv := lg.UID, lg.ResourceVersion
	target := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: lg.Namespace, Name: lg.Name}}
	err = c.Client.Delete(ctx, target, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case err == nil:
		grantsCollected.Inc()
		c.index.forget(e.uid, e)
	case apierrors.IsNotFound(err):
		c.index.forget(e.uid, e)
	case apierrors.IsConflict(err):
	default:
		return err
	}
	return nil
}

// collectable: ended, not being deleted already, and no unresolved write recorded.
func collectable(lg *locksv1.LockGrant) bool {
	return lg.Status.Phase.Terminal() && lg.DeletionTimestamp == nil && !recordsUnresolvedMutation(lg)
}

// endedIndex holds the collectable LockGrants this replica has seen, in a
// FIFO ordered by when it first saw each collectable. Times only grow (a
// clock set back is read as standing still), so the FIFO is sorted by time
// with no sort: the due entries are a prefix of it. An entry forgotten (its
// LockGrant deleted or no longer collectable) leaves the map at once and the
// FIFO lazily, when it reaches the front or when forgotten entries outnumber
// the tracked ones (a compaction costs no more, amortized, than the entries
// it drops). Memory is thereby bounded by the LockGrants the cache holds.
//
// Its methods are safe for concurrent use: the informer's handler and the
// collector's pass both use it.
type endedIndex struct {
	mu    sync.Mutex
	byUID map[types.UID]*endedEntry
	fifo  []*endedEntry
	// forgotten counts the forgotten entries still in fifo.
	forgotten int
	// examined counts the entries passes have looked at (tests read it).
	examined int
}

// endedEntry is one LockGrant seen collectable.
type endedEntry struct {
	key       client.ObjectKey
	uid       types.UID
	since     time.Time
	forgotten bool
}

// compactBelow: fewer forgotten entries than this are never compacted away
// before they reach the front.
const compactBelow = 1024

// observe records lg as the cache now holds it and returns how many
// LockGrants are tracked: a collectable one not tracked yet is added as first
// seen at now; one not collectable is forgotten.
func (x *endedIndex) observe(lg *locksv1.LockGrant, now time.Time) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !collectable(lg) {
		x.forgetLocked(lg.UID, nil)
		return len(x.byUID)
	}
	if _, ok := x.byUID[lg.UID]; ok {
		return len(x.byUID)
	}
	if n := len(x.fifo); n > 0 && now.Before(x.fifo[n-1].since) {
		now = x.fifo[n-1].since
	}
	if x.byUID == nil {
		x.byUID = map[types.UID]*endedEntry{}
	}
	e := &endedEntry{key: client.ObjectKeyFromObject(lg), uid: lg.UID, since: now}
	x.byUID[lg.UID] = e
	x.fifo = append(x.fifo, e)
	endedGrantsTracked.Set(float64(len(x.byUID)))
	return len(x.byUID)
}

// forget drops the LockGrant uid; with only set, only if that is the entry
// tracked for it (not one added since, as it became collectable again).
func (x *endedIndex) forget(uid types.UID, only *endedEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.forgetLocked(uid, only)
}

func (x *endedIndex) forgetLocked(uid types.UID, only *endedEntry) {
	e, ok := x.byUID[uid]
	if !ok || (only != nil && e != only) {
		return
	}
	delete(x.byUID, uid)
	e.forgotten = true
	x.forgotten++
	endedGrantsTracked.Set(float64(len(x.byUID)))
	x.dropForgotten()
}

// dropForgotten drops the forgotten entries at the front of the FIFO, and
// all of them once they outnumber the tracked ones.
func (x *endedIndex) dropForgotten() {
	for len(x.fifo) > 0 && x.fifo[0].forgotten {
		x.fifo[0] = nil
		x.fifo = x.fifo[1:]
		x.forgotten--
	}
	if x.forgotten < compactBelow || x.forgotten <= len(x.byUID) {
		return
	}
	kept := make([]*endedEntry, 0, len(x.byUID))
	for _, e := range x.fifo {
		if !e.forgotten {
			kept = append(kept, e)
		}
	}
	x.fifo, x.forgotten = kept, 0
}

// due returns, oldest first, the tracked entries due at now: first seen at
// least retention ago, or beyond the newest maxCount
// (negative: no bound). It looks at the due entries and the first one not due
// (and at forgotten ones among them), never at the rest. The entries stay
// tracked until the pass forgets them.
func (x *endedIndex) due(now time.Time, retention time.Duration, maxCount int) []*endedEntry {
	x.mu.Lock()
	defer x.mu.Unlock()
	over := 0
	if maxCount >= 0 {
		over = len(x.byUID) - maxCount
	}
	var due []*endedEntry
	for _, e := range x.fifo {
		x.examined++
		if e.forgotten {
			continue
		}
		if len(due) >= over && now.Sub(e.since) < retention {
			break
		}
		due = append(due, e)
	}
	return due
}

// tracked is how many LockGrants the index holds.
func (x *endedIndex) tracked() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byUID)
}
