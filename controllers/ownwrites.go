package controllers

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// ownWrites keeps, per FencedResource, the issuer's own compare-and-swaps
// its cache does not show yet (issuer.OwnWrites), so that a decision asked
// for meanwhile is made from the latest of them rather than from the version
// it replaced, which could only lose its compare-and-swap. An entry lives
// for the informer's lag: the FencedResource watch drops it once the cache
// shows the write (shownOwnWrites), and so does the next gather.
type ownWrites struct {
	mu sync.Mutex
	by map[types.NamespacedName]issuer.OwnWrites
	// echo is the resourceVersion the issuer's latest compare-and-swap of
	// each FencedResource left, until its watch delivers that version
	// (ownEcho). Kept apart from by, which a gather may drop first.
	echo map[types.NamespacedName]string
}

// get is the memory of key's own writes, taken before the cache is read:
// an entry dropped in between was dropped because the cache shows it.
func (o *ownWrites) get(key types.NamespacedName) issuer.OwnWrites {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.by[key]
}

// view is the FencedResource to decide from (issuer.OwnWrites.View),
// given the memory get returned before cached was read; it drops the memory
// when cached shows the latest own write.
func (o *ownWrites) view(own issuer.OwnWrites, cached *locksv1.FencedResource) *locksv1.FencedResource {
	if own.Latest == nil {
		return cached
	}
	if !own.Lags(cached.ResourceVersion) {
		o.shown(cached)
		return cached
	}
	return own.View(cached)
}

// wrote records a compare-and-swap of key on version from that left it as
// fr (the API server's response). It keeps its own copy: the decision's
// input goes on to its mirror, and nothing it does there may change what a
// later decision starts from.
func (o *ownWrites) wrote(key types.NamespacedName, from string, fr *locksv1.FencedResource) {
	fr = fr.DeepCopy()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by, o.echo = map[types.NamespacedName]issuer.OwnWrites{}, map[types.NamespacedName]string{}
	}
	o.by[key] = o.by[key].Wrote(from, fr)
	o.echo[key] = fr.ResourceVersion
}

// ownEcho reports whether fr, as the watch delivers it, is the version the
// issuer's latest compare-and-swap of it left, and forgets that version.
// Such a version asks for no decision: the swap succeeded on the version
// before it, which the decision had read, so everything in it was that
// decision's input or its output. Whatever changed since (a LockGrant, the
// clock, the issuer's identity) asks for its own.
func (o *ownWrites) ownEcho(fr client.Object) bool {
	key := client.ObjectKeyFromObject(fr)
	o.mu.Lock()
	defer o.mu.Unlock()
	if rv, ok := o.echo[key]; ok && rv == fr.GetResourceVersion() {
		delete(o.echo, key)
		return true
	}
	return false
}

// shown drops the memory of fr's own writes when fr, as the cache now has
// it, is not older than the latest of them.
func (o *ownWrites) shown(fr client.Object) {
	key := client.ObjectKeyFromObject(fr)
	o.mu.Lock()
	defer o.mu.Unlock()
	if own, ok := o.by[key]; ok && !own.Lags(fr.GetResourceVersion()) {
		delete(o.by, key)
	}
}

// forget drops the memory of key's own writes: the FencedResource is gone,
// or a compare-and-swap lost (someone else wrote; the cache will show it).
func (o *ownWrites) forget(key types.NamespacedName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.by, key)
	delete(o.echo, key)
}

// shownOwnWrites passes a FencedResource's events on, first dropping the
// memory of the issuer's own writes the cache now shows: the informer has
// stored an object before its handlers see it, so from then on a gather
// reads that version or a newer one. The echo of the issuer's latest own
// write is not passed on (ownEcho): a decision from it would decide
// nothing new, and it would come just as the lock's next request does.
type shownOwnWrites struct {
	handler.TypedEventHandler[client.Object, reconcile.Request]
	own *ownWrites
}

// Create implements handler.EventHandler.
func (h shownOwnWrites) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.own.shown(e.Object)
	h.TypedEventHandler.Create(ctx, e, q)
}

// Update implements handler.EventHandler.
func (h shownOwnWrites) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.own.shown(e.ObjectNew)
	if h.own.ownEcho(e.ObjectNew) {
		return
	}
	h.TypedEventHandler.Update(ctx, e, q)
}

// Delete implements handler.EventHandler.
func (h shownOwnWrites) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	h.own.forget(client.ObjectKeyFromObject(e.Object))
	h.TypedEventHandler.Delete(ctx, e, q)
}
