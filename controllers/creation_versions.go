package controllers

import (
	"context"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// CreationVersions remembers the resourceVersion each LockGrant had when the
// cache first received it: the FIFO tie-break between requests the issuer
// first sees in one pass and whose creationTimestamps (whole seconds) are
// equal (issuer.Input.CreationVersion). Resource versions of one resource
// are comparable and grow with every write, so the order of two creations'
// versions is the order the API server committed them.
//
// For a LockGrant the watch delivers, that is its creation's version. For
// one a list delivers (the informer's first, or a relist after its watch
// expired), it is its latest change's at the time. Before the issuer queues
// a request, the LockGrant webhook lets only its owner (or a break-glass
// administrator) change it, and the issuer writes no status to it: a change
// can only move it back, never ahead.
//
// The versions are taken in the cache's transform, which the informer runs
// on each event before it stores the object: a reconcile that lists a
// LockGrant from the cache always finds its version. One is kept while its
// LockGrant is in the cache and not ended, so the memory is bounded by the
// cache's own.
type CreationVersions struct {
	mu sync.Mutex
	of map[types.UID]uint64
}

// NewCreationVersions returns an empty memory; pass it to CacheOptions and
// to the issuer (Options.CreationVersions) of the same manager.
func NewCreationVersions() *CreationVersions {
	return &CreationVersions{of: map[types.UID]uint64{}}
}

// Of is the version the LockGrant uid had when first received; ok is false
// for one never received, already ended, or whose version is not a number.
// A nil memory knows none.
func (v *CreationVersions) Of(uid types.UID) (rv uint64, ok bool) {
	if v == nil {
		return 0, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	rv, ok = v.of[uid]
	return rv, ok
}

// received keeps lg's version the first time it is seen, and forgets it
// once lg ended: an ended request is never queued again.
func (v *CreationVersions) received(lg *locksv1.LockGrant) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if lg.Status.Phase.Terminal() {
		delete(v.of, lg.UID)
		return
	}
	if _, ok := v.of[lg.UID]; ok {
		return
	}
	if rv, err := strconv.ParseUint(lg.ResourceVersion, 10, 64); err == nil {
		v.of[lg.UID] = rv
	}
}

func (v *CreationVersions) forget(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.of, uid)
}

// len is how many LockGrants' versions are kept.
func (v *CreationVersions) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.of)
}

// transform keeps a LockGrant's version on its way into the cache, then
// bounds it as every LockGrant is (boundLockGrant).
func (v *CreationVersions) transform(obj any) (any, error) {
	if lg, ok := obj.(*locksv1.LockGrant); ok {
		v.received(lg)
	}
	return boundLockGrant(obj)
}

// forgetDeleted drops the versions of LockGrants deleted before they ended.
// The informer runs the transform on a deletion's object before it
// notifies handlers, so none is kept again after this.
func (v *CreationVersions) forgetDeleted(ctx context.Context, c cache.Cache) error {
	if v == nil {
		return nil
	}
	inf, err := c.GetInformer(ctx, &locksv1.LockGrant{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if lg, ok := obj.(*locksv1.LockGrant); ok {
			v.forget(lg.UID)
		}
	}})
	return err
}
