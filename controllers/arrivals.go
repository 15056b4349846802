package controllers

import (
	"context"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// deferredArrivals keeps, per FencedResource, the arrivals its last committed
// decision left out of the registry queue (issuer.QueueDelay and
// issuer.Decision.Confirm), for the next decision, and confirms the held
// ones with reads around the cache outside the resource's pass. Losing it
// costs only reads: the next decision confirms them again.
type deferredArrivals struct {
	mu      sync.Mutex
	by      map[types.NamespacedName]issuer.Arrivals
	reading map[types.UID]bool // arrivals a confirmation read is under way for
}

func (a *deferredArrivals) get(key types.NamespacedName) issuer.Arrivals {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.by[key]
}

// set keeps what a committed decision deferred (nothing: forget). A
// confirmation that landed while the decision was made, in the same chain,
// is kept.
func (a *deferredArrivals) set(key types.NamespacedName, deferred issuer.Arrivals) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(deferred.FirstSeen) == 0 {
		delete(a.by, key)
		return
	}
	if a.by == nil {
		a.by = map[types.NamespacedName]issuer.Arrivals{}
	}
	if old := a.by[key]; old.Since != "" && old.Since == deferred.Since {
		var landed []types.UID
		for uid, ok := range old.Confirmed {
			if ok && !deferred.Confirmed[uid] {
				landed = append(landed, uid)
			}
		}
		deferred = deferred.Confirm(deferred.Since, landed)
	}
	a.by[key] = deferred
}

func (a *deferredArrivals) forget(key types.NamespacedName) { a.set(key, issuer.Arrivals{}) }

// maxConfirmReads bounds the confirmation reads in flight across resources.
const maxConfirmReads = 16

// confirmLater reads the arrivals a committed decision held back
// (issuer.Decision.Confirm) around the cache, outside the resource's pass,
// records those never granted in the memory's chain they were asked in, and
// asks for a new decision. An arrival already being read is not read twice.
func (r *IssuerReconciler) confirmLater(ctx context.Context, key types.NamespacedName, in *issuer.Input, d *issuer.Decision) {
	if ask := r.arrivals.claim(in, d.Confirm); len(ask) > 0 {
		go r.confirm(ctx, key, d.Deferred.Since, ask)
	}
}

// claim marks the named arrivals as being read and returns copies of those
// no read is under way for.
func (a *deferredArrivals) claim(in *issuer.Input, names []string) []*locksv1.LockGrant {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reading == nil {
		a.reading = map[types.UID]bool{}
	}
	var ask []*locksv1.LockGrant
	for _, name := range names {
		i := slices.IndexFunc(in.Grants, func(lg locksv1.LockGrant) bool { return lg.Name == name })
		if i >= 0 && !a.reading[in.Grants[i].UID] {
			a.reading[in.Grants[i].UID] = true
			ask = append(ask, in.Grants[i].DeepCopy())
		}
	}
	return ask
}

// confirm reads ask around the cache (maxConfirmReads at most in flight
// across resources), records the ones never granted in the chain since,
// and asks for a new decision of key.
func (r *IssuerReconciler) confirm(ctx context.Context, key types.NamespacedName, since string, ask []*locksv1.LockGrant) {
	var mu sync.Mutex
	var never []types.UID
	read := func(ctx context.Context, c *locksv1.LockGrant) error {
		select {
		case r.confirmSlots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-r.confirmSlots }()
		uncachedGrantReads.Inc()
		var fresh locksv1.LockGrant
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(c), &fresh); err != nil {
			return client.IgnoreNotFound(err) // gone: the next decision drops it
		}
		if issuer.NeverGranted(c, &fresh) {
			mu.Lock()
			never = append(never, c.UID)
			mu.Unlock()
		}
		return nil
	}
	var err error
	if len(ask) == 1 { // the usual arrival: read on this goroutine
		err = read(ctx, ask[0])
	} else {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(maxConcurrentGrantReads) // a tenant's thousand arrivals are not a thousand goroutines
		for _, c := range ask {
			g.Go(func() error { return read(gctx, c) })
		}
		err = g.Wait()
	}
	a := &r.arrivals
	a.mu.Lock()
	for _, c := range ask {
		delete(a.reading, c.UID)
	}
	if cur, ok := a.by[key]; ok {
		a.by[key] = cur.Confirm(since, never)
	}
	a.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		ctrl.LoggerFrom(ctx).Error(err, "confirm arrivals around the cache", "fencedresource", key)
	}
	r.requeue.after(key, 0)
}
