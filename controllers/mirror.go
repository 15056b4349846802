package controllers

import (
	"context"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/issuing"
)

// mirrorJob is what follows one committed decision: its Events, then the
// LockGrant statuses (endings first) and finalizers, each patched at the
// resourceVersion the decision saw.
type mirrorJob struct {
	resource *locksv1.FencedResource
	grants   map[string]*locksv1.LockGrant // by name, as the decision saw them
	decision issuing.Decision
}

// grantMirror writes committed decisions onto the LockGrants off the issuer's
// critical path: the reconcile that made a decision returns once its
// compare-and-swap landed, so the next decision for that FencedResource (the
// next handoff) does not wait for two LockGrant status writes. Nothing here
// is needed for safety: the registry holds the grant (holder record, digest,
// proof) and the client and the webhook follow it; the mirror is what
// kubectl shows and rebuildable from the registry by any later decision.
//
// Jobs are keyed by FencedResource: one at a time per resource (so the
// order "endings first, never two LockGrants Held" holds across decisions),
// and a job not yet started is replaced by the next decision's, which plans
// from a view at least as new (coalescing under load).
type grantMirror struct {
	reconciler *GrantIssuerReconciler
	workers    int
	log        logr.Logger
	queue      workqueue.TypedRateLimitingInterface[types.NamespacedName]
	// replan asks the issuer to decide a FencedResource again, when a job
	// lost a race with a newer LockGrant and its plan is stale.
	replan chan event.GenericEvent

	mu      sync.Mutex
	pending map[types.NamespacedName]*mirrorJob
}

func newGrantMirror(r *GrantIssuerReconciler, workers int, log logr.Logger) *grantMirror {
	return &grantMirror{
		reconciler: r, workers: workers, log: log,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
		replan:  make(chan event.GenericEvent, 64),
		pending: map[types.NamespacedName]*mirrorJob{},
	}
}

// enqueue hands a committed decision's follow-up writes to the mirror.
func (m *grantMirror) enqueue(in *issuing.Input, d *issuing.Decision) {
	if len(d.Events) == 0 && len(d.GrantStatus) == 0 && len(d.AddFinalizer) == 0 && len(d.RemoveFinalizer) == 0 {
		return
	}
	job := &mirrorJob{resource: in.Resource.DeepCopy(), grants: map[string]*locksv1.LockGrant{}, decision: *d}
	for i := range in.Grants {
		job.grants[in.Grants[i].Name] = in.Grants[i].DeepCopy()
	}
	key := types.NamespacedName{Namespace: in.Resource.Namespace, Name: in.Resource.Name}
	m.mu.Lock()
	if prev := m.pending[key]; prev != nil {
		// The newer decision re-plans the statuses from a newer view, but
		// the older one's Events are still news.
		job.decision.Events = append(prev.decision.Events, job.decision.Events...)
	}
	m.pending[key] = job
	m.mu.Unlock()
	m.queue.Add(key)
}

// replanSource is the watch source through which the mirror re-triggers the issuer.
func (m *grantMirror) replanSource() source.TypedSource[reconcile.Request] {
	return source.Channel(m.replan, &handler.EnqueueRequestForObject{})
}

// NeedLeaderElection is true: only the leader's decisions are mirrored.
func (m *grantMirror) NeedLeaderElection() bool { return true }

// Start runs the workers until ctx ends. Jobs still pending then are lost
// with the process; the next leader's decisions rebuild them.
func (m *grantMirror) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range max(m.workers, 1) {
		wg.Go(func() {
			for m.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	m.queue.ShutDown()
	wg.Wait()
	return nil
}

func (m *grantMirror) next(ctx context.Context) bool {
	key, shutdown := m.queue.Get()
	if shutdown {
		return false
	}
	defer m.queue.Done(key)
	m.mu.Lock()
	job := m.pending[key]
	delete(m.pending, key)
	m.mu.Unlock()
	if job == nil {
		m.queue.Forget(key)
		return true
	}
	stale, err := m.reconciler.mirror(ctx, job)
	switch {
	case err != nil:
		m.log.Error(err, "mirror a decision onto its LockGrants", "fencedResource", key)
		m.mu.Lock()
		if m.pending[key] == nil { // retry it unless a newer decision replaced it
			job.decision.Events = nil // already recorded
			m.pending[key] = job
		}
		m.mu.Unlock()
		m.queue.AddRateLimited(key)
	case stale:
		m.queue.Forget(key)
		select {
		case m.replan <- event.GenericEvent{Object: job.resource}:
		case <-ctx.Done():
		}
	default:
		m.queue.Forget(key)
	}
	return true
}

// mirror writes a job: Events, then the LockGrant statuses in the decision's
// order, then finalizers. stale is true when a LockGrant moved since the
// decision (a conflict) or is gone: the issuer must decide again.
func (r *GrantIssuerReconciler) mirror(ctx context.Context, job *mirrorJob) (stale bool, err error) {
	fr, d := job.resource, &job.decision
	byUID := map[string]*locksv1.LockGrant{}
	for _, lg := range job.grants {
		byUID[string(lg.UID)] = lg
	}
	for _, e := range d.Events {
		var regarding client.Object = fr
		if lg := byUID[e.GrantUID]; lg != nil {
			regarding = lg
		}
		r.Recorder.Eventf(regarding, fr, e.Type, e.Reason, e.Reason, "%s", e.Note)
	}
	for _, c := range d.GrantStatus {
		if err := r.patchGrant(ctx, job.grants[c.Name], true, func(lg *locksv1.LockGrant) { lg.Status = c.Status }); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return true, nil // keep the order: nothing later is written before this one lands
			}
			return false, err
		}
	}
	for _, name := range d.RemoveFinalizer {
		if stale, err = finalizerWritten(stale, r.patchGrant(ctx, job.grants[name], false, removeFinalizer)); err != nil {
			return stale, err
		}
	}
	for _, name := range d.AddFinalizer {
		err := r.patchGrant(ctx, job.grants[name], false, func(lg *locksv1.LockGrant) { lg.Finalizers = append(lg.Finalizers, locksv1.GrantFinalizer) })
		if stale, err = finalizerWritten(stale, err); err != nil {
			return stale, err
		}
	}
	return stale, nil
}

// finalizerWritten folds a finalizer patch's outcome: a LockGrant that is
// gone needs nothing, a conflict makes the plan stale, anything else is an error.
func finalizerWritten(stale bool, err error) (bool, error) {
	switch {
	case err == nil || apierrors.IsNotFound(err):
		return stale, nil
	case apierrors.IsConflict(err):
		return true, nil
	}
	return stale, err
}

func removeFinalizer(lg *locksv1.LockGrant) {
	lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
}
