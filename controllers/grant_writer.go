package controllers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// grantWriter writes a committed decision's LockGrant writes (statuses and
// finalizers) outside the lock's pass. A pass is what a release waits for:
// when the pass also wrote the ended holder's status and the waiters'
// bookkeeping, every release arriving meanwhile waited for those writes too,
// longer the more loaded the API server. Nothing of the protocol
// waits for these writes: lockclient is HELD from the registry's holder
// record, the webhook reads the registry, and the registry's recentlyEnded
// says which LockGrants ended whatever their status shows.
//
// The writes of one FencedResource are written by one worker at a time
// (the queue is keyed by FencedResource), in the order that matters: every
// ended grant's final status, then the new holder's Held. A newer plan
// replaces one not yet written: each plan is decided from the whole cache, so
// it holds every write still needed. A write that meets a conflict stops its
// plan and asks the issuer for a new decision.
type grantWriter struct {
	write   func(ctx context.Context, w grantWrites) error // one LockGrant's writes in order
	workers int

	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]
	mu    sync.Mutex
	plans map[types.NamespacedName]grantPlan
	// behind counts, per FencedResource, the final statuses of ended grants
	// planned and not yet written (maxEndsBehind).
	behind map[types.NamespacedName]int

	requeue *issuerRequeue
}

// maxEndsBehind bounds how many ended grants of one FencedResource may wait
// for their final status: past it, the issuer decides nothing more for that
// resource until the writer caught up. recentlyEnded (16) is what tells an
// ended grant whose status has not landed from a waiting request, and each
// pass ends at most one grant, so the record always covers them.
const maxEndsBehind = locksv1.MaxRecentlyEnded / 2

// grantPlan is one committed decision's LockGrant writes.
type grantPlan struct {
	ends        []grantWrites // final statuses of ended grants: first, at once
	holder      []grantWrites // the new holder's status (and the holder's renewals): after the ends
	bookkeeping []grantWrites // everything else, bookkeepingPerPass per turn
}

func (p grantPlan) empty() bool { return len(p.ends)+len(p.holder)+len(p.bookkeeping) == 0 }

func newGrantWriter(workers int, requeue *issuerRequeue, write func(context.Context, grantWrites) error) *grantWriter {
	return &grantWriter{
		write: write, workers: max(workers, 1), requeue: requeue,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "lockgrant-writes"}),
		plans:  map[types.NamespacedName]grantPlan{},
		behind: map[types.NamespacedName]int{},
	}
}

// submit hands a committed decision's writes for key to the writer,
// replacing the plan not yet started.
func (w *grantWriter) submit(key types.NamespacedName, p grantPlan) {
	if p.empty() {
		return // a plan not yet started stays: it was committed too
	}
	w.mu.Lock()
	w.plans[key] = p
	w.behind[key] = len(p.ends)
	lockGrantWriteBacklog.Set(float64(len(w.plans)))
	w.mu.Unlock()
	w.queue.Add(key)
}

// endsBehind is how many ended grants of key still wait for their final status.
func (w *grantWriter) endsBehind(key types.NamespacedName) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.behind[key]
}

// Start runs the workers until ctx ends; what is left unwritten then is the
// next leader's to decide again.
func (w *grantWriter) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.workers {
		wg.Go(func() {
			for w.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	return nil
}

// next writes one turn of one FencedResource's plan.
func (w *grantWriter) next(ctx context.Context) bool {
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	p, ok := w.plans[key]
	delete(w.plans, key)
	lockGrantWriteBacklog.Set(float64(len(w.plans)))
	w.mu.Unlock()
	if !ok {
		return true
	}
	left, retry, err := w.run(ctx, key, p)
	w.mu.Lock()
	if _, newer := w.plans[key]; !newer {
		delete(w.behind, key)
		if !left.empty() && !retry && err == nil {
			w.plans[key] = left // the rest of the bookkeeping, after the other resources' turns
			w.queue.Add(key)
		}
	}
	w.mu.Unlock()
	switch {
	case err != nil && ctx.Err() == nil:
		ctrl.LoggerFrom(ctx).Error(err, "write LockGrants", "fencedresource", key)
		w.requeue.backoff(key)
	case retry:
		w.requeue.after(key, conflictRetry)
	}
	return true
}

// run writes one turn of p: the ends at once, then the holder, then up to
// bookkeepingPerPass LockGrants of bookkeeping. left is what remains; retry:
// a write met a conflict, and the issuer must decide again.
func (w *grantWriter) run(ctx context.Context, key types.NamespacedName, p grantPlan) (left grantPlan, retry bool, err error) {
	if retry, err = w.parallel(ctx, p.ends); retry || err != nil {
		return grantPlan{}, retry, err
	}
	w.mu.Lock()
	if _, newer := w.plans[key]; !newer {
		delete(w.behind, key)
	}
	w.mu.Unlock()
	for _, g := range p.holder {
		if retry, err = retryable(false, w.write(ctx, g)); retry || err != nil {
			return grantPlan{}, retry, err
		}
	}
	now := p.bookkeeping
	if len(now) > bookkeepingPerPass {
		now, left.bookkeeping = now[:bookkeepingPerPass], now[bookkeepingPerPass:]
	}
	retry, err = w.parallel(ctx, now)
	return left, retry, err
}

// parallel writes grants, bookkeepingParallel LockGrants at a time (one
// LockGrant's writes in order). One LockGrant, the usual plan, is written on
// the worker's goroutine: a new one would grow its stack again for the
// request's JSON, each time.
func (w *grantWriter) parallel(ctx context.Context, grants []grantWrites) (retry bool, err error) {
	if len(grants) == 1 {
		return retryable(false, w.write(ctx, grants[0]))
	}
	errs := make([]error, len(grants))
	sem := make(chan struct{}, bookkeepingParallel)
	var wg sync.WaitGroup
	for i, g := range grants {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = w.write(ctx, g)
		})
	}
	wg.Wait()
	for _, e := range errs {
		if retry, err = retryable(retry, e); err != nil {
			return false, err
		}
	}
	return retry, nil
}

// issuerRequeue is the issuer's work queue, captured from a source of the
// controller, through which work done outside a reconcile (the writer's
// conflicts, confirmations of arrivals) asks for a new decision.
type issuerRequeue struct {
	q atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

func (r *issuerRequeue) source() source.TypedSource[reconcile.Request] {
	return source.TypedFunc[reconcile.Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		r.q.Store(&q)
		return nil
	})
}

// after asks for a decision of key after d (0: now).
func (r *issuerRequeue) after(key types.NamespacedName, d time.Duration) {
	if q := r.q.Load(); q != nil {
		(*q).AddAfter(reconcile.Request{NamespacedName: key}, d)
	}
}

// backoff asks for a decision of key after the issuer's failure backoff for it.
func (r *issuerRequeue) backoff(key types.NamespacedName) {
	if q := r.q.Load(); q != nil {
		(*q).AddRateLimited(reconcile.Request{NamespacedName: key})
	}
}
